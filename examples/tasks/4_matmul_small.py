# Reference task: float32 matrix product of two 64x64 matrices
import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B for square float32 matrices."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


N = 64


def get_inputs():
    A = torch.randn(N, N)
    B = torch.randn(N, N)
    return [A, B]


def get_init_inputs():
    return []
