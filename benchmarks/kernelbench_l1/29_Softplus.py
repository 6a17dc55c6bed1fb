# expected: correct
# Softplus (beta=1, threshold=20, as F.softplus): one flat masked elementwise kernel (int64 offsets, 1024 elements and 4 warps a program).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softplus_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    # log(1 + exp(x)) written stably as max(x, 0) + log(1 + exp(-|x|)); linear above the threshold 20
    y = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
    y = tl.where(x > 20.0, x, y)
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        if n_elements == 0:
            return out
        BLOCK_SIZE = 1024
        grid = (triton.cdiv(n_elements, BLOCK_SIZE),)
        softplus_kernel[grid](x, out, n_elements, BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
        return out
