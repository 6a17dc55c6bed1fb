"""One-call evaluation from Python: `drkernel.evaluate(reference_src, candidate_src)`."""

from __future__ import annotations

from typing import Any

from drkernel.runner.devices import discover_gpus, resolve_device
from drkernel.runner.sandbox import Sandbox
from drkernel.schema import EvalOptions, EvalRequest, EvalResult


def evaluate(reference: str, candidate: str, options: EvalOptions | None = None, **overrides: Any) -> EvalResult:
    """Evaluate one candidate source against one reference source in a fresh sandboxed process.

    For many evaluations use `drkernel.scheduling.scheduler.Scheduler`, which keeps workers warm.
    """
    options = EvalOptions.from_dict({**(options or EvalOptions()).to_dict(), **overrides})
    device = resolve_device(options.device)
    sandbox = Sandbox(device=device, gpu=discover_gpus()[0] if device == "cuda" else None)
    try:
        return sandbox.evaluate(EvalRequest(reference, candidate, options))
    finally:
        sandbox.close()
