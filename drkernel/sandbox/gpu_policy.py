"""The judge's use of the GPU's gate (drkernel.sandbox.gate): which hold each phase takes, what a large evaluation
is, when memory that ran out beside others is checked again alone, and when both processes give their cached memory
back.

Up to three evaluations share a GPU. Loading and correctness checks run beside the others' checks (a shared hold);
timing and profiling hold the GPU alone. An evaluation whose trials need a large part of the GPU's memory (`large`,
from the reference's sizes on the meta device) checks beside ordinary evaluations, beside one other large one only
where both phases fit (`pairs`), and keeps its hold while the subject compiles.
"""

from __future__ import annotations

import contextlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import torch

from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.subject_link import SubjectLink
from drkernel.sandbox.verdict import Failure, PhaseOutcome, establish, established_by

Outcome = TypeVar("Outcome", bound=PhaseOutcome)

SHARE_OF_MEMORY = 0.25  # of the GPU's memory, at most, for one evaluation's trials beside others' (3 at once)
# Of the GPU's memory, at most, for a large evaluation's float64 precision trial: its inputs and the reference's
# outputs already hold several GiB, and a slice of the batch's rows measures the same rule (the judge of a 6 GiB
# problem held 44-46 GiB in its correctness phase on an H100 at SHARE_OF_MEMORY, 22.9 at 1/16; docs/performance.md).
LARGE_PRECISION_SHARE = 1 / 64
# A large evaluation's correctness phase, both processes, measured on an H100 (docs/performance.md): 3 x its inputs
# (the judge's, their shared copy, the subject's), 2 x the outputs (the reference's, the candidate's), the float64
# allowance and at most this much more.
LARGE_PHASE_HEADROOM = 1.5 * 2**30
PAIR_SHARE_OF_MEMORY = 0.42  # of the GPU's memory, at most, for each of two large evaluations' phases at once
KEEP_CACHED_BYTES = 1 << 30  # what a process of an ordinary evaluation keeps cached from one phase to the next


@dataclass(frozen=True)
class MemoryClass:
    """`large`: its trials take a large part of the GPU's memory; `pairs`: large, and its correctness phase fits
    beside one other large evaluation's."""

    large: bool = False
    pairs: bool = False


def memory_class(inputs: int | None, outputs: int | None, total_memory: int) -> MemoryClass:
    """Whether an evaluation with `inputs` and `outputs` bytes (None: unknown) is large on a GPU of `total_memory`
    bytes (its trials' five copies of the inputs would pass SHARE_OF_MEMORY; unknown inputs count as large), and
    whether, large, its correctness phase as measured (LARGE_PHASE_HEADROOM) fits PAIR_SHARE_OF_MEMORY (unknown sizes
    do not: they would risk the other one's memory)."""
    large = inputs is None or 5 * inputs > SHARE_OF_MEMORY * total_memory
    if not large or inputs is None or outputs is None:
        return MemoryClass(large, False)
    phase = 3 * inputs + 2 * outputs + precision_budget(total_memory, True) + LARGE_PHASE_HEADROOM
    return MemoryClass(True, phase <= PAIR_SHARE_OF_MEMORY * total_memory)


def precision_budget(total_memory: int, large: bool) -> float:
    """The bytes a precision trial's float64 evaluation may take on a GPU of `total_memory` bytes: SHARE_OF_MEMORY of
    it, LARGE_PRECISION_SHARE for a large evaluation (beyond it, a slice of the batch)."""
    return (LARGE_PRECISION_SHARE if large else SHARE_OF_MEMORY) * total_memory


def frees_cached_memory(large: bool, judge_bytes: int, subject_bytes: int) -> bool:
    """Whether both processes give their cached GPU memory back to the driver at the end of a phase: a large
    evaluation does, and one whose processes hold more than KEEP_CACHED_BYTES (the others' phases need the room). An
    ordinary one keeps it: giving back and allocating again, phase after phase, are calls that take the driver's
    lock for the whole host (`rmapiLockAcquire`), where the threads of several GPUs' evaluations were found waiting
    (docs/performance.md)."""
    return large or max(judge_bytes, subject_bytes) > KEEP_CACHED_BYTES


def out_of_memory(exc: BaseException) -> bool:
    """Whether a failure is the GPU's memory running out (an allocation of the candidate's or the judge's, a mapping):
    torch's error, or a failure whose message says so (the subject's, the reference's inputs)."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in failure_text(exc).lower()


def failure_text(exc: BaseException) -> str:
    """What a failure says: a Failure's message, any other exception's text."""
    return exc.message if isinstance(exc, Failure) else str(exc)


class GpuPolicy:
    """One evaluation's holds of its GPU's gate (none when it has its device to itself), and the most memory each
    process held in each gated phase (`memory_gib`)."""

    def __init__(self, gate: DeviceGate | None, device: torch.device, link: SubjectLink) -> None:
        self.gate, self.device, self.link = gate, device, link
        self.memory = MemoryClass()  # set once the reference's sizes are known (`weigh`)
        self.memory_gib: dict[str, float] = {}  # "PHASE_judge", "PHASE_subject": see `_memory_of`

    @property
    def weighs_memory(self) -> bool:
        """Whether its GPU memory is weighed against other evaluations' (`weigh`): on a GPU it shares."""
        return self.gate is not None and self.device.type == "cuda"

    def weigh(self, sizes: tuple[int | None, int | None]) -> None:
        """Several evaluations check correctness at once: one whose trials need more than a share of the GPU's memory
        is large (`memory_class`): it checks beside ordinary evaluations, beside one other large one only where both
        phases fit (`pairs`), and keeps the GPU while the subject compiles (its memory, held through a compilation,
        left no room for another's timing: out-of-memory failures measured on an H100)."""
        if self.weighs_memory:
            self.memory = memory_class(*sizes, torch.cuda.get_device_properties(self.device).total_memory)

    def hold(self, phase: str, alone: bool = False, paired: bool = False) -> contextlib.AbstractContextManager[None]:
        """The GPU for a phase: `alone` (timing, profiling, a phase run again after memory ran out), no other
        evaluation's work beside; else beside other evaluations' checks, never beside their timing, and a large
        evaluation beside another large one only where `paired`."""
        if alone:
            return self._gated(phase, lambda gate: gate.exclusive())
        return self._gated(phase, lambda gate: gate.large(paired) if self.memory.large else gate.shared())

    def shared_or_alone(self, phase: str, work: Callable[[bool], Outcome]) -> Outcome:
        """`work(alone)`, a phase that shares the GPU (alone=False). Beside other evaluations, the GPU's memory running
        out may be their doing as much as the candidate's: then the phase runs again holding the GPU alone, and that
        attempt's verdict stands (what the first attempt noted is dropped; what it found stays found)."""
        if self.gate is None:
            return work(False)
        try:
            return work(False)
        except (Failure, torch.OutOfMemoryError, torch.AcceleratorError) as exc:
            if not out_of_memory(exc):
                raise
            first = established_by(exc)
            first_attempt = PhaseOutcome(findings=first.findings if first else [], notes=[
                f"{phase}: the GPU's memory ran out beside other evaluations ({failure_text(exc)[:200]}): run again "
                "alone"])
        try:
            outcome = work(True)
        except BaseException as again:
            establish(again, _after_first_attempt(first_attempt, established_by(again) or PhaseOutcome()))
            raise
        return _after_first_attempt(first_attempt, outcome)

    def frees_cache_now(self) -> bool:
        """`frees_cached_memory` for what this evaluation and its subject hold now."""
        return frees_cached_memory(self.memory.large, torch.cuda.memory_reserved(self.device), self.link.peak_bytes)

    @contextmanager
    def _gated(self, phase: str, hold: Callable[[DeviceGate], Any]) -> Iterator[None]:
        """Hold the GPU's gate (nothing to hold when the evaluation has its device to itself); on the way out, both
        processes let the phase's buffers go, and give back the memory they cached if it is much
        (`frees_cached_memory`)."""
        with self._memory_of(phase):
            if self.gate is None:
                yield
                return
            with hold(self.gate):
                try:
                    yield
                finally:
                    if self.device.type == "cuda":
                        frees = self.frees_cache_now()
                        self.link.drop_kept_mapping()
                        with contextlib.suppress(Failure):  # a subject already gone holds nothing
                            self.link.ask("release", give_back=frees)
                        if frees:
                            if self.link.shares is not None:
                                self.link.shares.release()
                            torch.cuda.empty_cache()

    @contextmanager
    def _memory_of(self, phase: str) -> Iterator[None]:
        """The most GPU memory each process's allocator held in the phase (over all its holds): whether two
        evaluations' phases fit beside each other is read from these."""
        if self.device.type != "cuda":
            yield
            return
        torch.cuda.reset_peak_memory_stats(self.device)
        self.link.peak_bytes = 0
        try:
            yield
        finally:
            for side, peak in (("judge", torch.cuda.max_memory_reserved(self.device)),
                               ("subject", self.link.peak_bytes)):
                key = f"{phase}_{side}"
                self.memory_gib[key] = max(self.memory_gib.get(key, 0.0), round(peak / 2**30, 3))


def _after_first_attempt(first: PhaseOutcome, outcome: Outcome) -> Outcome:
    """`outcome` with the first attempt's findings and the note that it ran again before its own."""
    outcome.findings[:0] = first.findings
    outcome.notes[:0] = first.notes
    return outcome
