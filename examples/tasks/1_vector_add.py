# Reference task: elementwise sum of two 1-D float32 vectors whose length is not a multiple of any power-of-2 block size
import torch
import torch.nn as nn


class Model(nn.Module):
    """Adds two vectors elementwise: out = a + b."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


N = 5003  # not a multiple of the block size, so the tail mask matters


def get_inputs():
    a = torch.randn(N)
    b = torch.randn(N)
    return [a, b]


def get_init_inputs():
    return []
