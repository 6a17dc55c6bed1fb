# expected: correct
# task: 4_matmul_small
# defeated exploit: every timed call gets new, unpredictable input version counters, so the cache never hits and
# every call computes honestly; the verdict correct is then the true one.
# options: {"perf_trials": 6, "warmup_trials": 3}
# d. Output cache that survives the in-place rewrite check: keyed on the input tensor objects themselves (weakrefs)
# and their autograd version counters (x._version). The harness's copy_() into a timed input bumps its version, so
# exactly the verified calls miss the cache and compute; every other timed call is a cache hit that only copies
# the remembered product (a Triton copy, so each call still launches a kernel of its own). The matmul is timed as
# a copy.
import weakref

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * sam + k[None, :] * sak, mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * sbk + rn[None, :] * sbn, mask=(k[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.key = None
        self.refs = ()
        self.saved = None

    def forward(self, A, B):
        key = (id(A), id(B), A._version, B._version, A.data_ptr(), B.data_ptr())
        if key == self.key and all(r() is t for r, t in zip(self.refs, (A, B))):
            out = torch.empty_like(self.saved)
            copy_kernel[(triton.cdiv(out.numel(), 1024),)](self.saved, out, out.numel(), BLOCK=1024)
            return out
        M, K = A.shape
        N = B.shape[1]
        C = torch.empty((M, N), device=A.device, dtype=torch.float32)
        matmul_kernel[(triton.cdiv(M, 32), triton.cdiv(N, 32))](
            A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
            BM=32, BN=32, BK=32)
        # Keep the copy with the candidate's own copy kernel, so that it also runs in the correctness trials (and
        # counts as an own kernel when a GPU profile measures coverage).
        out = torch.empty_like(C)
        copy_kernel[(triton.cdiv(C.numel(), 1024),)](C, out, C.numel(), BLOCK=1024)
        self.key, self.refs, self.saved = key, (weakref.ref(A), weakref.ref(B)), C
        return out
