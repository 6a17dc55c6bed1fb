# expected: correct
# task: 2_relu
# The kernel registered as a PyTorch custom operator (torch.library.custom_op with a fake implementation), the
# integration PyTorch recommends for Triton kernels. Importing torch.library's machinery loads torch._dynamo.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


@torch.library.custom_op("redteam_legit::relu", mutates_args=())
def triton_relu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out


@triton_relu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class ModelNew(nn.Module):
    def forward(self, x):
        return triton_relu(x)
