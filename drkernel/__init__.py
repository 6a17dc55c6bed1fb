"""drkernel: KernelGym and the learning signals of Dr. Kernel.

Evaluate LLM-written Triton kernels against PyTorch references in isolated processes, with hacking checks,
profiling coverage and honest timings; turn results into rewards and advantages for RL.
"""

from drkernel.runner.evaluate import evaluate
from drkernel.schema import EvalOptions, EvalRequest, EvalResult, Status

__all__ = ["evaluate", "EvalOptions", "EvalRequest", "EvalResult", "Status"]
__version__ = "0.1.0"
