# expected: correct
# task: row_max
# Two kernels passing integer data: the first writes each row's argmax (int64), the second gathers the values at
# those indices. The index buffer is also an output.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def argmax_kernel(x_ptr, idx_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    tl.store(idx_ptr + row, tl.argmax(x, axis=0).to(tl.int64))


@triton.jit
def gather_kernel(x_ptr, idx_ptr, val_ptr, stride):
    row = tl.program_id(0)
    i = tl.load(idx_ptr + row)
    tl.store(val_ptr + row, tl.load(x_ptr + row * stride + i))


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        idx = torch.empty(rows, device=x.device, dtype=torch.int64)
        vals = torch.empty(rows, device=x.device, dtype=x.dtype)
        argmax_kernel[(rows,)](x, idx, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
        gather_kernel[(rows,)](x, idx, vals, x.stride(0))
        return vals, idx
