"""The verdict, decided in one function from what the phases returned (drkernel.sandbox.verdict.decide), and the
error kinds the scheduler reads."""

from __future__ import annotations

import json

from drkernel.sandbox import guards
from drkernel.sandbox.verdict import Failure, Finding, PhaseOutcome, decide, establishing, established_by
from drkernel.schema import Correctness, ErrorInfo, ErrorKind, EvalOptions, EvalResult, HARNESS_ERRORS, Status


def _decided(outcomes: list[PhaseOutcome], failure: Failure | None = None, reported: list[Finding] | None = None,
             check_hacks: bool = True) -> EvalResult:
    return decide(EvalResult(), Correctness(trials=5, passed_trials=5), outcomes, failure, reported or [],
                  EvalOptions(check_hacks=check_hacks))


def test_phases_without_findings_are_correct_and_their_notes_read_in_order() -> None:
    result = _decided([PhaseOutcome(notes=["loaded"]), PhaseOutcome(), PhaseOutcome(notes=["timed", "again"])])
    assert result.status is Status.CORRECT and result.correct and result.error is None
    assert result.notes == ["loaded", "timed", "again"] and result.hack_reasons == [] and result.hack_details == {}
    assert result.correctness is not None and result.correctness.passed_trials == 5


def test_findings_of_every_phase_and_the_subject_are_reasons_in_the_order_found_the_first_message_kept() -> None:
    first = Finding(guards.TORCH_COMPUTE, "the subject saw torch compute")  # reported by the subject, first
    correctness = PhaseOutcome()
    correctness.hack(guards.PRECISION_DOWNCAST, "bfloat16 arithmetic")
    timing = PhaseOutcome(findings=[Finding(guards.OUTPUT_CACHING, "a wrong timed call")])
    again = Finding(guards.PRECISION_DOWNCAST, "found a second time")
    late = Finding(guards.GLOBAL_FLAGS, "flags changed")  # reported by the subject after the phases' findings
    result = _decided([correctness, timing, PhaseOutcome(findings=[again])], reported=[first, late])
    assert result.status is Status.HACKED and not result.correct
    assert result.hack_reasons == [guards.TORCH_COMPUTE, guards.PRECISION_DOWNCAST, guards.OUTPUT_CACHING,
                                   guards.GLOBAL_FLAGS]
    assert result.hack_details[guards.PRECISION_DOWNCAST] == "bfloat16 arithmetic"


def test_a_failure_carries_what_its_phase_had_established() -> None:
    """A mismatch in a lower precision: the phase's finding makes it hacked, its notes stay; the error is the
    failure's."""
    try:
        with establishing(PhaseOutcome(notes=["precision: measured on rows 0-15 of 64"])) as correctness:
            correctness.hack(guards.LOWER_PRECISION, "an output is torch.float16")
            raise Failure(Status.INCORRECT, ErrorKind.MISMATCH, "trial 2 (train): 12 of 4096 elements differ")
    except Failure as caught:
        failure = caught
    assert established_by(failure) is correctness
    result = _decided([PhaseOutcome(notes=["loaded"])], failure)
    assert result.status is Status.HACKED and result.hack_reasons == [guards.LOWER_PRECISION]
    assert result.error is not None and (result.error.kind, result.error.message) == (
        "Mismatch", "trial 2 (train): 12 of 4096 elements differ")
    assert result.notes == ["loaded", "precision: measured on rows 0-15 of 64"]


def test_a_finding_that_only_explains_a_failure_leaves_its_status() -> None:
    death = Failure(Status.CRASHED, ErrorKind.EXIT, "the evaluation process exited with code 3 before it answered")
    result = _decided([], death, reported=[Finding(guards.EXIT_CALLED, "the candidate ended its process")])
    assert result.status is Status.CRASHED and result.hack_reasons == [guards.EXIT_CALLED]


def test_without_hack_checks_findings_decide_nothing() -> None:
    result = _decided([PhaseOutcome(findings=[Finding(guards.DECOY_KERNEL, "decoys")])], check_hacks=False)
    assert result.status is Status.CORRECT and result.hack_reasons == [] and result.hack_details == {}


def test_error_kinds_are_today_s_strings_and_the_harness_s_are_named_once() -> None:
    """The scheduler and the caches read the enum; the JSON holds the same strings as before it."""
    assert [kind.value for kind in sorted(HARNESS_ERRORS)] == ["BackendError", "SandboxError", "WorkerLost"]
    for kind in ErrorKind:
        info = ErrorInfo(kind=kind, message="m")
        assert ErrorKind.of(kind.value) is kind and info.blames_harness is (kind in HARNESS_ERRORS)
        assert json.loads(EvalResult(status=Status.CRASHED, error=info).to_json())["error"]["kind"] == kind.value
    assert ErrorKind.of("ZeroDivisionError") is None  # an exception's class name, the candidate's
    assert not ErrorInfo(kind="ZeroDivisionError", message="m").blames_harness
    assert EvalResult.from_json(EvalResult.failed(Status.CRASHED, ErrorKind.WORKER_LOST, "lost").to_json()
                                ).error.blames_harness  # type: ignore[union-attr]
