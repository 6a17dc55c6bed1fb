"""Where a fork server's start-up goes (twenty-sixth session): its imports by top-level module, its preload's parts."""
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torch._dynamo
t2 = time.perf_counter()
import triton, triton.runtime.interpreter, triton.testing, torch.profiler
t3 = time.perf_counter()
import drkernel.sandbox.zygote as z
t4 = time.perf_counter()
from triton.runtime.cache import triton_key
triton_key(); t5 = time.perf_counter()
z.judge.timing.speedup_interval([1.0, 1.0], [1.0, 1.0], seed=0); t6 = time.perf_counter()
try:
    import triton.experimental.gluon.language, triton.experimental.gluon.nvidia.hopper
except ImportError:
    pass
t7 = time.perf_counter()
print(f"torch {t1-t0:.2f} dynamo {t2-t1:.2f} triton+profiler {t3-t2:.2f} drkernel {t4-t3:.2f} | triton_key {t5-t4:.2f} "
      f"numpy bootstrap {t6-t5:.2f} gluon {t7-t6:.2f} | total {t7-t0:.2f}")
