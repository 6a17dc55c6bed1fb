"""The verdict: a pure function of what the judge's phases established, so that it can be read and tested alone."""

from __future__ import annotations

from typing import Any

from drkernel.sandbox import guards
from drkernel.schema import Correctness, ErrorInfo, EvalOptions, EvalResult, Status


def decide(result: EvalResult, correctness: Correctness | None, failure: Any, findings: guards.Findings,
           notes: list[str], options: EvalOptions) -> EvalResult:
    """`result` holds the measurements; `failure` (a judge.Failure, or None) ended the phases early. Any finding
    that is not merely an explanation of a failure makes the evaluation `hacked`; only a clean run is `correct`."""
    if failure is None:
        result.status = Status.CORRECT.value
    else:
        result.status = failure.status.value
        result.error = ErrorInfo(kind=failure.kind, message=failure.message, traceback=failure.tb)
    result.correctness = correctness
    if options.check_hacks and set(findings.details) - guards.FAILURE_CODES:
        result.status = Status.HACKED.value
    result.hack_reasons = findings.codes if options.check_hacks else []
    result.hack_details = dict(findings.details) if options.check_hacks else {}
    result.correct = result.status == Status.CORRECT.value
    result.notes = notes
    return result
