# Reference task: LayerNorm over the last dimension with learnable (randomly initialised) weight and bias
import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension.

    nn.LayerNorm starts with weight=1 and bias=0; they are redrawn here (weight first, then bias) so that a kernel that
    ignores them fails. A ModelNew must create its weight and bias the same way, in the same order, so that the same
    seed gives the same values.
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-5):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape, eps=eps)
        with torch.no_grad():
            self.ln.weight.normal_(1.0, 0.5)
            self.ln.bias.normal_(0.0, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch_size = 32
features = 256


def get_inputs():
    x = torch.randn(batch_size, features) * 2.0 + 0.5
    return [x]


def get_init_inputs():
    return [features]
