# expected: correct
# task: 1_vector_add
# Honest but launch-heavy: the vector is added in 8 chunks, one small Triton launch per chunk, all on the current
# stream. On a GPU the host-side launch overhead of 8 Python launches is far longer than the GPU time of these tiny
# kernels; that is not work hidden from the timer.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, start, stop, BLOCK: tl.constexpr):
    offs = start + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < stop
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        step = triton.cdiv(n, 8)
        for start in range(0, n, step):
            stop = min(n, start + step)
            add_kernel[(triton.cdiv(stop - start, 256),)](a, b, out, start, stop, BLOCK=256)
        return out
