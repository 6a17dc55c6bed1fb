# expected: correct
# task: 2_relu
# Inference-engine style: the output buffer is allocated once (a non-persistent module buffer) and every call
# writes its result there and returns it, as CUDA-graph friendly code does. The kernel computes every element.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("out", torch.empty(0), persistent=False)

    def forward(self, x):
        x = x.contiguous()
        if self.out.shape != x.shape or self.out.device != x.device:
            self.out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, self.out, x.numel(), BLOCK=1024)
        return self.out
