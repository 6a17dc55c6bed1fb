# expected: correct
# Argmax over one dimension (int64 indices, dim removed; ties go to the first index, as in torch.argmax).
# x is viewed as (outer, R, inner); a program walks down R in [BLOCK_R, BLOCK_I] tiles for BLOCK_I contiguous
# inner positions (coalesced loads), keeping a running (max, index) a column; a flat 1-D grid covers any size.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def argmax_dim_kernel(x_ptr, out_ptr, R, INNER, num_i_blocks, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    pid = tl.program_id(axis=0).to(tl.int64)
    outer = pid // num_i_blocks
    pid_i = pid % num_i_blocks
    offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < INNER
    base = outer * R * INNER
    best_val = tl.full([BLOCK_I], -float("inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_I], tl.int64)
    for r0 in range(0, R, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        mask = (offs_r[:, None] < R) & mask_i[None, :]
        ptrs = base + offs_r[:, None].to(tl.int64) * INNER + offs_i[None, :]
        x = tl.load(x_ptr + ptrs, mask=mask, other=-float("inf")).to(tl.float32)
        tile_max = tl.max(x, axis=0)
        # first row of the tile that holds the tile's max (R stands for "none")
        cand = tl.where((x == tile_max[None, :]) & mask, offs_r[:, None], R)
        tile_idx = tl.min(cand, axis=0).to(tl.int64)
        better = tile_max > best_val  # strict: an equal value later in R never replaces an earlier one
        best_idx = tl.where(better, tile_idx, best_idx)
        best_val = tl.where(better, tile_max, best_val)
    tl.store(out_ptr + outer * INNER + offs_i, best_idx, mask=mask_i)


def _blocks(R, inner):
    # 32 x 64 tiles and 4 warps measured best on an H200 for (128, 4096, 4095) over dim 1
    BLOCK_I = min(triton.next_power_of_2(inner), 64)
    BLOCK_R = min(max(2048 // BLOCK_I, 1), triton.next_power_of_2(R))
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
        out = torch.empty(shape[:dim] + shape[dim + 1:], device=x.device, dtype=torch.int64)
        if out.numel() == 0:
            return out
        if R == 0:
            raise IndexError("argmax(): cannot reduce over an empty dimension")
        BLOCK_R, BLOCK_I = _blocks(R, inner)
        num_i_blocks = triton.cdiv(inner, BLOCK_I)
        grid = (num_i_blocks * outer,)
        argmax_dim_kernel[grid](x, out, R, inner, num_i_blocks, BLOCK_R=BLOCK_R, BLOCK_I=BLOCK_I, num_warps=4)
        return out
