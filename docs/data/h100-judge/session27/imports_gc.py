"""The fork server's imports, in its order, with Python's cyclic garbage collector on ("on", as before the
twenty-seventh session) or off ("off", as the fork server now imports): their time and the full collections made."""
import gc, sys, time

if sys.argv[1] == "off":
    gc.disable()
t0 = time.perf_counter()
import triton  # noqa: E402, F401
import torch  # noqa: E402, F401
import torch.profiler  # noqa: E402, F401
import triton.runtime.interpreter, triton.testing  # noqa: E402, F401, E401
import drkernel.sandbox.judge, drkernel.sandbox.subject, drkernel.sandbox.gate  # noqa: E402, F401, E401
t1 = time.perf_counter()
print(f"gc {sys.argv[1]}: imports {t1 - t0:.2f} s, full collections {gc.get_stats()[2]['collections']}, "
      f"objects {len(gc.get_objects())}")
