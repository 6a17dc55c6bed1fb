"""The verdict: what the judge's phases established, and the one function that decides from it.

Each phase returns a `PhaseOutcome` (its own results, the hack findings it made, the notes it wrote); a phase that
cannot go on raises a `Failure`, which holds what that phase had established up to then. The subject's own checks
report findings on its replies (drkernel.sandbox.subject_link keeps them). `decide` reads all of it, so that the
verdict can be read and tested alone.
"""

from __future__ import annotations

import contextlib
import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, TypeVar

from drkernel.sandbox import guards
from drkernel.schema import Correctness, ErrorInfo, EvalOptions, EvalResult, Status

Outcome = TypeVar("Outcome", bound="PhaseOutcome")
_FOUND_ORDER = itertools.count()  # hack reasons are reported in the order they were found, whoever found them


@dataclass(frozen=True)
class Finding:
    """A hack reason code (guards) and the message a model can learn from."""

    code: str
    message: str
    order: int = field(default_factory=lambda: next(_FOUND_ORDER), compare=False)


@dataclass(kw_only=True)
class PhaseOutcome:
    """What a phase found beside its own results: hack findings and notes for the result."""

    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def hack(self, code: str, message: str) -> None:
        self.findings.append(Finding(code, message))

    def found(self, code: str) -> bool:
        return any(finding.code == code for finding in self.findings)


class Failure(Exception):
    """Ends a phase, and with it the evaluation, with a status other than correct: `kind` is an ErrorKind or the
    class name of an exception the candidate's or the reference's code raised. `established` is what the phase it
    ended had found by then (its findings and notes count; a correctness phase's summary says how far it got)."""

    def __init__(self, status: Status, kind: str, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.tb = status, kind, message, tb
        self.established: PhaseOutcome | None = None


@contextmanager
def establishing(outcome: Outcome) -> Iterator[Outcome]:
    """A phase's outcome as it grows: whatever exception ends the phase early holds it (`established_by`)."""
    try:
        yield outcome
    except BaseException as exc:
        establish(exc, outcome)
        raise


def establish(exc: BaseException, outcome: PhaseOutcome) -> None:
    """Let `exc`, which ends a phase, hold what the phase had established (a Failure's `established`; any other
    exception, the judge's own, gets the same attribute)."""
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__ holds nothing
        exc.established = outcome  # type: ignore[attr-defined]


def established_by(exc: BaseException) -> PhaseOutcome | None:
    return getattr(exc, "established", None)


def decide(result: EvalResult, correctness: Correctness | None, outcomes: list[PhaseOutcome],
           failure: Failure | None, reported: list[Finding], options: EvalOptions) -> EvalResult:
    """`result` holds the measurements; `outcomes` are the phases that ran to their end, in order; `failure` (or None)
    ended the next one early; `reported` are the subject's findings. Any finding that is not merely an explanation of
    a failure makes the evaluation `hacked`; only a clean run is `correct`. A reason found twice keeps its first
    message."""
    phases = [*outcomes, *([failure.established] if failure is not None and failure.established else [])]
    details: dict[str, str] = {}
    for finding in sorted([*reported, *(f for phase in phases for f in phase.findings)], key=lambda f: f.order):
        details.setdefault(finding.code, finding.message)
    if failure is None:
        result.status = Status.CORRECT
    else:
        result.status = failure.status
        result.error = ErrorInfo(kind=failure.kind, message=failure.message, traceback=failure.tb)
    result.correctness = correctness
    if options.check_hacks and set(details) - guards.FAILURE_CODES:
        result.status = Status.HACKED
    result.hack_reasons = list(details) if options.check_hacks else []
    result.hack_details = details if options.check_hacks else {}
    result.correct = result.status == Status.CORRECT
    result.notes = [note for phase in phases for note in phase.notes]
    return result
