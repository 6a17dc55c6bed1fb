# expected: correct
# LayerNorm over a large normalized_shape (few, very long rows): per-chunk mean/M2 in parallel, a Chan combine per row,
# then a parallel normalise-and-affine pass.
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

MAX_CHUNKS = 65535  # CUDA's limit on grid axis 1


@triton.jit
def ln_partial_stats_kernel(x_ptr, mean_ptr, m2_ptr, N, num_chunks,
                            BLOCK_SIZE: tl.constexpr, ITERS: tl.constexpr):
    # Program (row, chunk) takes x[row, chunk*ITERS*BLOCK_SIZE : ...] and writes that chunk's mean and M2.
    row = tl.program_id(axis=0).to(tl.int64)
    chunk = tl.program_id(axis=1).to(tl.int64)
    x_row = x_ptr + row * N
    start = chunk * (ITERS * BLOCK_SIZE)
    acc = tl.zeros([BLOCK_SIZE], tl.float32)
    cnt = tl.zeros([BLOCK_SIZE], tl.float32)
    for i in range(ITERS):
        offs = start + i * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < N
        acc += tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        cnt += mask.to(tl.float32)
    n = tl.sum(cnt, axis=0)
    mean = tl.sum(acc, axis=0) / n
    m2 = tl.zeros([BLOCK_SIZE], tl.float32)
    for i in range(ITERS):
        offs = start + i * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < N
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        m2 += d * d
    tl.store(mean_ptr + row * num_chunks + chunk, mean)
    tl.store(m2_ptr + row * num_chunks + chunk, tl.sum(m2, axis=0))


@triton.jit
def ln_combine_kernel(mean_ptr, m2_ptr, row_mean_ptr, row_rstd_ptr, N, num_chunks, chunk_len, eps,
                      BLOCK_P: tl.constexpr):
    # Chan et al.: mean = sum(n_i mean_i) / N, M2 = sum(M2_i) + sum(n_i (mean_i - mean)^2).
    row = tl.program_id(axis=0).to(tl.int64)
    base = row * num_chunks
    s = tl.zeros([BLOCK_P], tl.float32)
    for p0 in range(0, num_chunks, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        mask = p < num_chunks
        n_i = tl.minimum(N - p.to(tl.int64) * chunk_len, chunk_len).to(tl.float32)
        mu = tl.load(mean_ptr + base + p, mask=mask, other=0.0)
        s += tl.where(mask, n_i * mu, 0.0)
    mean = tl.sum(s, axis=0) / N
    m2 = tl.zeros([BLOCK_P], tl.float32)
    for p0 in range(0, num_chunks, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        mask = p < num_chunks
        n_i = tl.minimum(N - p.to(tl.int64) * chunk_len, chunk_len).to(tl.float32)
        mu = tl.load(mean_ptr + base + p, mask=mask, other=0.0)
        m2_i = tl.load(m2_ptr + base + p, mask=mask, other=0.0)
        d = mu - mean
        m2 += tl.where(mask, m2_i + n_i * d * d, 0.0)
    var = tl.sum(m2, axis=0) / N
    tl.store(row_mean_ptr + row, mean)
    tl.store(row_rstd_ptr + row, 1.0 / tl.sqrt(var + eps))


@triton.jit
def ln_normalize_kernel(x_ptr, w_ptr, b_ptr, out_ptr, row_mean_ptr, row_rstd_ptr, N,
                        BLOCK_SIZE: tl.constexpr, ITERS: tl.constexpr):
    # Rows on grid axis 0, so programs launched together share the same slice of weight and bias (L2 reuse).
    row = tl.program_id(axis=0).to(tl.int64)
    chunk = tl.program_id(axis=1).to(tl.int64)
    mean = tl.load(row_mean_ptr + row)
    rstd = tl.load(row_rstd_ptr + row)
    start = chunk * (ITERS * BLOCK_SIZE)
    for i in range(ITERS):
        offs = start + i * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < N
        x = tl.load(x_ptr + row * N + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(out_ptr + row * N + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple, eps: float = 1e-5):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        # Same parameters as nn.LayerNorm (weight = 1, bias = 0; no random draws).
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        N = math.prod(self.normalized_shape)
        x = x.contiguous()
        rows = x.numel() // N
        out = torch.empty_like(x)
        if x.numel() == 0:
            return out
        BLOCK_SIZE = min(4096, triton.next_power_of_2(N))
        blocks = triton.cdiv(N, BLOCK_SIZE)
        ITERS = triton.cdiv(blocks, MAX_CHUNKS)  # a program takes ITERS blocks when there are too many
        chunk_len = ITERS * BLOCK_SIZE
        num_chunks = triton.cdiv(N, chunk_len)
        part_mean = torch.empty((rows, num_chunks), device=x.device, dtype=torch.float32)
        part_m2 = torch.empty((rows, num_chunks), device=x.device, dtype=torch.float32)
        row_mean = torch.empty((rows,), device=x.device, dtype=torch.float32)
        row_rstd = torch.empty((rows,), device=x.device, dtype=torch.float32)
        w = self.weight.contiguous()
        b = self.bias.contiguous()
        grid = (rows, num_chunks)
        ln_partial_stats_kernel[grid](x, part_mean, part_m2, N, num_chunks,
                                      BLOCK_SIZE=BLOCK_SIZE, ITERS=ITERS, num_warps=8)
        ln_combine_kernel[(rows,)](part_mean, part_m2, row_mean, row_rstd, N, num_chunks, chunk_len, self.eps,
                                   BLOCK_P=min(1024, triton.next_power_of_2(num_chunks)), num_warps=4)
        ln_normalize_kernel[grid](x, w, b, out, row_mean, row_rstd, N,
                                  BLOCK_SIZE=BLOCK_SIZE, ITERS=ITERS, num_warps=8)
        return out
