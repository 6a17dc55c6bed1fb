"""Evaluation from Python in one line: `drkernel.evaluate(reference_src, candidate_src)`."""

from __future__ import annotations

from typing import Any

from drkernel.runner.devices import discover_gpus, resolve_device
from drkernel.runner.supervisor import Supervisor
from drkernel.schema import EvalOptions, EvalRequest, EvalResult


def evaluate(reference: str, candidate: str, options: EvalOptions | None = None, **overrides: Any) -> EvalResult:
    """Evaluate one candidate source against one reference source in a fresh sandboxed process.

    For many evaluations use `drkernel.scheduling.scheduler.Scheduler`, which keeps workers warm.
    """
    options = with_overrides(options, **overrides)
    supervisor = supervisor_for(options)
    try:
        return supervisor.run(EvalRequest(reference, candidate, options))
    finally:
        supervisor.close()


def with_overrides(options: EvalOptions | None, **overrides: Any) -> EvalOptions:
    """`options` (the defaults when None) with the named fields replaced, validated as a request's are."""
    return EvalOptions.from_dict({**(options or EvalOptions()).to_dict(), **overrides})


def supervisor_for(options: EvalOptions, judge_hosts: bool = True) -> Supervisor:
    """A supervisor of evaluations on the device the options ask for (on a GPU machine, the first GPU); the caller
    closes it. `judge_hosts`: see `Supervisor`."""
    device = resolve_device(options.device)
    return Supervisor(device=device, gpu=discover_gpus()[0] if device == "cuda" else None, judge_hosts=judge_hosts)
