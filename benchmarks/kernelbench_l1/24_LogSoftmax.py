# expected: correct
# LogSoftmax over dim (default 1) of a (batch, dim) tensor with very long rows: an online max/sum pass, then a write pass.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def log_softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    out_row = out_ptr + row * n_cols
    # Pass 1: per-lane running max m and running sum s of exp(x - m) (online softmax).
    m = tl.full([BLOCK_SIZE], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_SIZE], tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        live = m_new > -float("inf")  # lanes that have seen a finite value (avoids exp(-inf - -inf) = NaN)
        s = tl.where(live, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(tl.where(m > -float("inf"), s * tl.exp(m - row_max), 0.0), axis=0)
    log_sum = tl.log(row_sum)
    # Pass 2: x - max - log(sum).
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = x - row_max - log_sum
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim % x.dim()
        moved = dim != x.dim() - 1
        if moved:  # reduce over the last dimension: move dim there
            x = x.movedim(dim, -1)
        x = x.contiguous()
        n_cols = x.shape[-1]
        x2 = x.view(-1, n_cols)
        out = torch.empty_like(x2)
        if x2.numel() > 0:
            BLOCK_SIZE = min(4096, triton.next_power_of_2(n_cols))
            log_softmax_kernel[(x2.shape[0],)](x2, out, n_cols, BLOCK_SIZE=BLOCK_SIZE, num_warps=8)
        out = out.view(x.shape)
        if moved:
            out = out.movedim(-1, dim).contiguous()
        return out
