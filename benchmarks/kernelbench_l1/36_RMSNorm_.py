# expected: correct
# RMSNorm over dim 1 of (batch, features, *): each program takes all features of a block of spatial positions.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, out_ptr, C, S, eps, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    # x is viewed as (B, C, S); this program normalises x[b, :, s0:s0 + BLOCK_S] over C.
    pid_s = tl.program_id(axis=0)
    b = tl.program_id(axis=1).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    mask_s = offs_s < S
    base = b * C * S
    sum_sq = tl.zeros([BLOCK_S], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        mask = (offs_c[:, None] < C) & mask_s[None, :]
        ptrs = base + offs_c[:, None].to(tl.int64) * S + offs_s[None, :]
        x = tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
        sum_sq += tl.sum(x * x, axis=0)
    inv_rms = 1.0 / tl.sqrt(sum_sq / C + eps)
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        mask = (offs_c[:, None] < C) & mask_s[None, :]
        ptrs = base + offs_c[:, None].to(tl.int64) * S + offs_s[None, :]
        x = tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
        y = x * inv_rms[None, :]
        tl.store(out_ptr + ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        B, C = x.shape[0], x.shape[1]
        S = x.numel() // max(B * C, 1)
        out = torch.empty_like(x)
        if x.numel() == 0:
            return out
        BLOCK_C = min(triton.next_power_of_2(C), 64)
        BLOCK_S = 256  # 64 x 256 tiles, 8 warps: best of those tried on an H200 for (112, 64, 512, 512)
        grid = (triton.cdiv(S, BLOCK_S), B)
        rms_norm_kernel[grid](x, out, C, S, self.eps, BLOCK_C=BLOCK_C, BLOCK_S=BLOCK_S, num_warps=8)
        return out
