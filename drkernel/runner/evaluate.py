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
    options = with_overrides(options, **overrides)
    sandbox = sandbox_for(options)
    try:
        return sandbox.evaluate(EvalRequest(reference, candidate, options))
    finally:
        sandbox.close()


def with_overrides(options: EvalOptions | None, **overrides: Any) -> EvalOptions:
    """`options` (the defaults when None) with the named fields replaced, validated as a request's are."""
    return EvalOptions.from_dict({**(options or EvalOptions()).to_dict(), **overrides})


def sandbox_for(options: EvalOptions) -> Sandbox:
    """A sandbox on the device the options ask for (on a GPU machine, the first GPU); the caller closes it."""
    device = resolve_device(options.device)
    return Sandbox(device=device, gpu=discover_gpus()[0] if device == "cuda" else None)
