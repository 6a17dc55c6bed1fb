# Reference task: softmax over the last dimension of a (64, 128) float32 matrix
import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over each row (dim=1) of a 2-D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 64
dim = 128


def get_inputs():
    x = torch.randn(batch_size, dim) * 3.0
    return [x]


def get_init_inputs():
    return []
