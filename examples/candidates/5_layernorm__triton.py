# expected: correct
# LayerNorm over the last dimension, one program per row; weight and bias are created and drawn like the reference's.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, row_stride, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    diff = tl.where(mask, x - mean, 0.0)
    var = tl.sum(diff * diff, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * row_stride + cols, diff * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        # Same parameters, same draws, same order as the reference (nn.LayerNorm, then weight.normal_, bias.normal_).
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        with torch.no_grad():
            self.weight.normal_(1.0, 0.5)
            self.bias.normal_(0.0, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_cols = self.weight.numel()
        x2 = x.contiguous().view(-1, n_cols)
        out = torch.empty_like(x2)
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        layernorm_kernel[(x2.shape[0],)](x2, self.weight, self.bias, out, n_cols, x2.stride(0), self.eps,
                                         BLOCK_SIZE=BLOCK_SIZE)
        return out.view_as(x)
