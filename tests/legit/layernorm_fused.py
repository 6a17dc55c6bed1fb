# expected: correct
# task: 5_layernorm
# LayerNorm in one fused kernel: each program normalises ROWS rows at once (2-D block), mean, variance, scale and
# shift without leaving registers. Weight and bias are drawn like the reference's.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_rows_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_rows, n_cols, stride, eps,
                          ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    ptrs = rows[:, None] * stride + cols[None, :]
    x = tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    centered = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0)
    b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0)
    y = centered * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(out_ptr + ptrs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        with torch.no_grad():
            self.weight.normal_(1.0, 0.5)
            self.bias.normal_(0.0, 0.5)

    def forward(self, x):
        n_cols = self.weight.numel()
        x2 = x.reshape(-1, n_cols).contiguous()
        out = torch.empty_like(x2)
        rows = 4
        layernorm_rows_kernel[(triton.cdiv(x2.shape[0], rows),)](
            x2, self.weight, self.bias, out, x2.shape[0], n_cols, x2.stride(0), self.eps,
            ROWS=rows, BLOCK=triton.next_power_of_2(n_cols))
        return out.view(x.shape)
