# expected: correct
# task: 1_vector_add
# A helper @triton.jit function (masked load-add-store of one block) called from the kernel.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _add_block(a_ptr, b_ptr, out_ptr, offs, n):
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, a + b, mask=mask)


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    _add_block(a_ptr, b_ptr, out_ptr, offs, n)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
