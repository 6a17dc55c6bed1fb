"""Where a fork server's start-up goes (twenty-seventh session): torch's global dependencies loaded beside the imports
of pure Python ("thread"), alone first ("alone"), or by torch's import as before ("plain"); the imports in the fork
server's order."""
import sys, threading, time

mode = sys.argv[1]
t0 = time.perf_counter()
from drkernel.sandbox import torch_libraries  # noqa: E402

loader, loaded_in = None, [0.0]


def load() -> None:
    start = time.perf_counter()
    torch_libraries.load_global_deps()
    loaded_in[0] = time.perf_counter() - start


t1 = time.perf_counter()
if mode == "alone":
    load()
elif mode == "thread":
    loader = threading.Thread(target=load)
    loader.start()
t2 = time.perf_counter()
import sympy  # noqa: E402, F401
t3 = time.perf_counter()
import triton  # noqa: E402, F401
t4 = time.perf_counter()
if loader is not None:
    loader.join()
t5 = time.perf_counter()
import torch  # noqa: E402, F401
t6 = time.perf_counter()
import torch._dynamo  # noqa: E402, F401
t7 = time.perf_counter()
print(f"{mode}: drkernel {t1-t0:.2f} global-deps {loaded_in[0]:.2f} (before sympy {t2-t1:.2f}) sympy {t3-t2:.2f} "
      f"triton {t4-t3:.2f} wait {t5-t4:.2f} torch {t6-t5:.2f} dynamo {t7-t6:.2f} | total {t7-t0:.2f}")
