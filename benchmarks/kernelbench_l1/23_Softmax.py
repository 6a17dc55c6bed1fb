# expected: correct
# Softmax over dim=1 of a (batch, dim) tensor with very long rows: one program a row, an online max/sum pass, then a write pass.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
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
    inv_sum = 1.0 / row_sum
    # Pass 2: normalise.
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - row_max) * inv_sum
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = 1
        moved = x.dim() != 2
        if moved:  # softmax over dim 1 of an N-d tensor: move that dim last
            x = x.movedim(dim, -1)
        x = x.contiguous()
        n_cols = x.shape[-1]
        x2 = x.view(-1, n_cols)
        out = torch.empty_like(x2)
        if x2.numel() > 0:
            BLOCK_SIZE = min(4096, triton.next_power_of_2(n_cols))
            softmax_kernel[(x2.shape[0],)](x2, out, n_cols, BLOCK_SIZE=BLOCK_SIZE, num_warps=8)
        out = out.view(x.shape)
        if moved:
            out = out.movedim(-1, dim).contiguous()
        return out
