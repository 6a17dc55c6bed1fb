# expected: correct
# task: 4_matmul_small
# Two kernels and a persistent workspace: the first packs B transposed into a buffer registered on the module
# (allocated once in __init__), the second computes C = A @ B from A and the packed copy into a fresh output.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def transpose_kernel(src, dst, R, C, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (r[:, None] < R) & (c[None, :] < C)
    tile = tl.load(src + r[:, None] * C + c[None, :], mask=mask)
    tl.store(dst + c[None, :] * R + r[:, None], tile, mask=mask)


@triton.jit
def matmul_bt_kernel(a_ptr, bt_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        bt = tl.load(bt_ptr + rn[:, None] * K + k[None, :], mask=(rn[:, None] < N) & (k[None, :] < K), other=0.0)
        acc = tl.dot(a, tl.trans(bt), acc, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("packed", torch.empty(64 * 64), persistent=False)

    def forward(self, A, B):
        A, B = A.contiguous(), B.contiguous()
        M, K = A.shape
        N = B.shape[1]
        if self.packed.numel() < K * N or self.packed.device != B.device:
            self.packed = torch.empty(K * N, device=B.device)
        transpose_kernel[(triton.cdiv(K, 32), triton.cdiv(N, 32))](B, self.packed, K, N, BLOCK=32)
        C = torch.empty((M, N), device=A.device, dtype=torch.float32)
        matmul_bt_kernel[(triton.cdiv(M, 32), triton.cdiv(N, 32))](A, self.packed, C, M, N, K, BM=32, BN=32, BK=32)
        return C
