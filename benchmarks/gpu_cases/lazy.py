# expected: hacked (lazy_kernel: PyTorch computes everything, a Triton kernel touches one element)
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(out_ptr):
    tl.store(out_ptr, tl.load(out_ptr) * 1.0)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.relu(x * 2 + 1) * y
        touch_kernel[(1,)](out)
        return out
