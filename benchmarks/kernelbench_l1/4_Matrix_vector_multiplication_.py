# expected: correct
# Matrix-vector product A (M, K) @ B (K, 1) with a huge K: split-K, each program streams one row slice of A with
# 4096-wide vector loads and writes a partial dot product; a second small kernel adds the partials in a fixed order.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gemv_partial_kernel(a_ptr, b_ptr, part_ptr, M, K, N, stride_am, stride_ak, stride_bk, stride_bn,
                        k_per_split, SPLIT: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    split = tl.program_id(axis=1)
    col = tl.program_id(axis=2).to(tl.int64)
    k_start = split.to(tl.int64) * k_per_split
    acc = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        offs_k = k_start + k0 + tl.arange(0, BLOCK_K)
        mask = offs_k < K
        a = tl.load(a_ptr + row * stride_am + offs_k * stride_ak, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs_k * stride_bk + col * stride_bn, mask=mask, other=0.0).to(tl.float32)
        acc += a * b
    tl.store(part_ptr + (row * N + col) * SPLIT + split, tl.sum(acc, axis=0))


@triton.jit
def gemv_reduce_kernel(part_ptr, c_ptr, total, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(axis=0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(SPLIT):
        acc += tl.load(part_ptr + offs * SPLIT + s, mask=mask, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        M, K = A.shape
        K2, N = B.shape
        assert K == K2, "inner dimensions differ"
        A = A.contiguous()
        C = torch.empty((M, N), device=A.device, dtype=torch.promote_types(A.dtype, B.dtype))
        if C.numel() == 0:
            return C
        BLOCK_K = 4096
        # enough programs to fill the GPU several times over, each still streaming a long slice of its row
        SPLIT = 1
        while SPLIT < 64 and M * N * SPLIT < 16384 and K // (SPLIT * 2) >= 8 * BLOCK_K:
            SPLIT *= 2
        k_per_split = triton.cdiv(triton.cdiv(K, SPLIT), BLOCK_K) * BLOCK_K
        partials = torch.empty((M * N * SPLIT,), device=A.device, dtype=torch.float32)
        gemv_partial_kernel[(M, SPLIT, N)](A, B, partials, M, K, N, A.stride(0), A.stride(1),
                                           B.stride(0), B.stride(1), k_per_split,
                                           SPLIT=SPLIT, BLOCK_K=BLOCK_K, num_warps=8)
        total = M * N
        gemv_reduce_kernel[(triton.cdiv(total, 1024),)](partials, C, total, SPLIT=SPLIT, BLOCK=1024, num_warps=4)
        return C
