# expected: correct
# task: matmul_1024
# needs: cuda
# Two streams that really overlap and are joined before forward returns: the top half of C on the caller's stream,
# the bottom half on a stream of its own that waits for the inputs and that the caller's stream waits for. Every
# timed call ends when both halves are done: credited at its true time, no finding.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * N + rn[None, :], mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, A, B):
        A, B = A.contiguous(), B.contiguous()
        M, K = A.shape
        N = B.shape[1]
        half = M // 2
        C = torch.empty((M, N), device=A.device, dtype=torch.float32)
        if self.side is None:
            self.side = torch.cuda.Stream()
        caller = torch.cuda.current_stream()
        self.side.wait_stream(caller)
        grid = (triton.cdiv(half, 64), triton.cdiv(N, 64))
        matmul_kernel[grid](A, B, C, half, N, K, BM=64, BN=64, BK=32)
        with torch.cuda.stream(self.side):
            matmul_kernel[grid](A[half:], B, C[half:], M - half, N, K, BM=64, BN=64, BK=32)
        caller.wait_stream(self.side)
        return C
