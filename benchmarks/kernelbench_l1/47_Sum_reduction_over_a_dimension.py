# expected: correct
# Sum over one dimension (keepdim=True).
# x is viewed as (outer, R, inner); a program walks down R in [BLOCK_R, BLOCK_I] tiles for BLOCK_I contiguous
# inner positions (coalesced loads), accumulating in float32; a flat 1-D grid covers (outer, inner blocks) of any size.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(x_ptr, out_ptr, R, INNER, num_i_blocks, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    pid = tl.program_id(axis=0).to(tl.int64)
    outer = pid // num_i_blocks
    pid_i = pid % num_i_blocks
    offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < INNER
    base = outer * R * INNER
    acc = tl.zeros([BLOCK_R, BLOCK_I], tl.float32)
    for r0 in range(0, R, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        mask = (offs_r[:, None] < R) & mask_i[None, :]
        ptrs = base + offs_r[:, None].to(tl.int64) * INNER + offs_i[None, :]
        acc += tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + outer * INNER + offs_i, total.to(out_ptr.dtype.element_ty), mask=mask_i)


def _blocks(R, inner):
    # 64 x 128 tiles and 8 warps measured best on an H200 for (128, 4096, 4095) over dim 1
    BLOCK_I = min(triton.next_power_of_2(inner), 128)
    BLOCK_R = min(max(8192 // BLOCK_I, 1), triton.next_power_of_2(R))
    return BLOCK_R, BLOCK_I


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim % x.dim()
        x = x.contiguous()
        shape = list(x.shape)
        R = shape[dim]
        outer = 1
        for s in shape[:dim]:
            outer *= s
        inner = 1
        for s in shape[dim + 1:]:
            inner *= s
        out_shape = shape[:dim] + [1] + shape[dim + 1:]
        out = torch.empty(out_shape, device=x.device, dtype=x.dtype)
        if out.numel() == 0:
            return out
        if R == 0:
            return out.zero_()
        BLOCK_R, BLOCK_I = _blocks(R, inner)
        num_i_blocks = triton.cdiv(inner, BLOCK_I)
        grid = (num_i_blocks * outer,)
        sum_dim_kernel[grid](x, out, R, inner, num_i_blocks, BLOCK_R=BLOCK_R, BLOCK_I=BLOCK_I, num_warps=8)
        return out
