# expected: correct
# task: 2_relu
# PyTorch glue around the kernel: flatten with reshape/contiguous, torch.empty output plus a torch.zeros scratch
# flag, a strided view, and a final .view back to the input's shape.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def relu(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1).contiguous()
    out = torch.empty(flat.shape, device=x.device, dtype=x.dtype)
    _unused_flag = torch.zeros(1, device=x.device, dtype=torch.int32)
    relu_kernel[(triton.cdiv(flat.numel(), 512),)](flat, out, flat.numel(), BLOCK=512)
    return out.view(x.shape)


class ModelNew(nn.Module):
    def forward(self, x):
        y = relu(x.t().contiguous().t())  # a transposed copy in, same values out
        return y.view(x.shape[0], -1)
