# expected: correct
# task: 2_relu
# defeated exploit: every timed call gets new, unpredictable input version counters, so the cache never hits and
# every call computes honestly; the verdict correct is then the true one.
# options: {"perf_trials": 6, "warmup_trials": 3}
# d. The blunt form of d3: a timed call whose input object was seen before with the same version counter (i.e. the
# harness did not rewrite it for verification) returns uninitialised memory after a one-element Triton store. Only
# calls on fresh or rewritten inputs compute. Most timed calls return garbage.
import weakref

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = {}

    def forward(self, x):
        out = torch.empty_like(x)
        entry = self.seen.get(id(x))
        if entry is not None and entry[0]() is x and entry[1] == x._version:
            relu_kernel[(1,)](x, out, 1, BLOCK=16)  # one element: "a kernel ran"
            return out
        self.seen[id(x)] = (weakref.ref(x), x._version)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
