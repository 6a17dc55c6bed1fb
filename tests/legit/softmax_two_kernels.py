# expected: correct
# task: 3_softmax_rows
# Multi-kernel pipeline: the first kernel computes each row's max and sum of exponentials into a small stats
# buffer, the second consumes those stats to write the normalised row.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_stats_kernel(x_ptr, max_ptr, sum_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    m = tl.max(x, axis=0)
    s = tl.sum(tl.exp(x - m), axis=0)
    tl.store(max_ptr + row, m)
    tl.store(sum_ptr + row, s)


@triton.jit
def normalise_kernel(x_ptr, max_ptr, sum_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    m = tl.load(max_ptr + row)
    s = tl.load(sum_ptr + row)
    tl.store(out_ptr + row * stride + cols, tl.exp(x - m) / s, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        row_max = torch.empty(rows, device=x.device, dtype=torch.float32)
        row_sum = torch.empty(rows, device=x.device, dtype=torch.float32)
        out = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        row_stats_kernel[(rows,)](x, row_max, row_sum, cols, x.stride(0), BLOCK=block)
        normalise_kernel[(rows,)](x, row_max, row_sum, out, cols, x.stride(0), BLOCK=block)
        return out
