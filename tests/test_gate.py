"""The per-GPU device gate: correctness checks of several evaluations may overlap, timing and profiling never do,
and an evaluation waiting for the GPU is not timed out for it."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from drkernel.runner.supervisor import DeviceQueue, Supervisor
from drkernel.sandbox.correctness_phase import CorrectnessPhase, CorrectnessReport
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.gpu_policy import GpuPolicy, MemoryClass, memory_class
from drkernel.sandbox.judge_context import JudgeContext
from drkernel.sandbox.kernel_checks import Ablation, AblationPhase
from drkernel.sandbox.reference import sizes_on_meta
from drkernel.sandbox.verdict import Failure
from drkernel.schema import Status

from tests.test_scheduler import example


WAITING: dict[str, bool] = {}  # what each named gate last told its supervisor


def _gate(tmp_path: Path, name: str) -> DeviceGate:
    WAITING[name] = False
    return DeviceGate(tmp_path / "gate", lambda waiting: WAITING.__setitem__(name, waiting))


def _try(hold, events: list[str], label: str) -> threading.Thread:
    def run() -> None:
        with hold():
            events.append(label)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_shared_holders_overlap_and_exclude_an_exclusive_one(tmp_path: Path) -> None:
    a, b, timer = _gate(tmp_path, "a"), _gate(tmp_path, "b"), _gate(tmp_path, "t")
    events: list[str] = []
    with a.shared():
        with b.shared():  # a second correctness check at the same time: no wait
            events.append("b shared")
        writer = _try(timer.exclusive, events, "timing")
        time.sleep(0.3)
        assert events == ["b shared"] and WAITING["t"]
        late_reader = _try(b.shared, events, "b again")  # arrives after the waiting writer: waits for it
        time.sleep(0.3)
        assert events == ["b shared"]
    writer.join(5)
    late_reader.join(5)
    assert events == ["b shared", "timing", "b again"]
    assert not WAITING["t"]


def test_a_long_shared_hold_makes_way_for_a_waiting_timing(tmp_path: Path) -> None:
    """A policy generating beside evaluations holds the gate shared and makes way between its steps: a timing that
    waits gets the GPU at the next step, and the generation goes on only once the timing is over."""
    generation, timer = DeviceGate(tmp_path / "gate"), _gate(tmp_path, "t")  # no supervisor to tell
    events: list[str] = []
    synced: list[int] = []

    def timing() -> None:
        with timer.exclusive():
            events.append("timing")
            time.sleep(0.3)
            events.append("timing done")

    with generation.shared():
        generation.make_way(lambda: synced.append(1))  # nobody waits: it goes straight on
        writer = threading.Thread(target=timing)
        writer.start()
        time.sleep(0.3)
        assert events == []  # the step in progress is not interrupted
        generation.make_way(lambda: synced.append(1))
        events.append("next step")
    writer.join(5)
    assert synced == [1, 1] and events == ["timing", "timing done", "next step"]


def test_exclusive_holder_blocks_everyone(tmp_path: Path) -> None:
    timer, other = _gate(tmp_path, "t"), _gate(tmp_path, "o")
    events: list[str] = []
    with timer.exclusive():
        threads = [_try(other.shared, events, "shared"), _try(_gate(tmp_path, "x").exclusive, events, "exclusive")]
        time.sleep(0.3)
        assert events == []
    for thread in threads:
        thread.join(5)
    assert sorted(events) == ["exclusive", "shared"]


def test_shared_holder_lets_the_lock_go_while_triton_compiles(tmp_path: Path) -> None:
    """The judge pauses its shared hold while the subject compiles (after the queued work is done) and resumes it
    before the kernel launches; a pause outside a yielding hold (timing) does nothing."""
    checker, timer = _gate(tmp_path, "c"), _gate(tmp_path, "t")
    synced: list[int] = []
    events: list[str] = []
    with checker.shared():
        checker.pause(lambda: synced.append(1))
        assert synced == [1]
        with timer.exclusive():  # another evaluation times while this one compiles
            events.append("timing")
            waiter = threading.Thread(target=checker.resume)
            waiter.start()  # the compilation ends: the kernel may launch only once the timing is over
            time.sleep(0.3)
            assert waiter.is_alive()
        waiter.join(5)
        events.append("launch")
        blocked = _try(timer.exclusive, events, "timing again")
        time.sleep(0.3)
        assert events == ["timing", "launch"]  # the shared hold is back
    blocked.join(5)
    assert events == ["timing", "launch", "timing again"]
    with timer.exclusive():
        timer.pause(lambda: synced.append(2))  # timing never lets go
        assert synced == [1]


def test_large_holders_check_beside_ordinary_ones_never_beside_each_other(tmp_path: Path) -> None:
    """An evaluation large in memory that cannot pair checks correctness beside ordinary ones, but another large one
    waits for it, and it keeps its hold through a compilation: no timing runs while its memory is taken."""
    big, other_big, small, timer = (_gate(tmp_path, n) for n in ("big", "big2", "s", "t"))
    events: list[str] = []
    synced: list[int] = []
    with big.large(paired=False):
        with small.shared():  # an ordinary check at the same time: no wait
            events.append("small")
        second = _try(lambda: other_big.large(paired=True), events, "big2")
        big.pause(lambda: synced.append(1))  # compiling: the hold is kept
        writer = _try(timer.exclusive, events, "timing")
        time.sleep(0.3)
        assert events == ["small"] and synced == [] and WAITING["big2"] and WAITING["t"]
        big.resume()
    second.join(5)
    writer.join(5)
    assert sorted(events[1:]) == ["big2", "timing"] and not WAITING["big2"] and not WAITING["t"]


def test_two_large_holders_that_fit_pair_and_one_that_does_not_waits_for_both(tmp_path: Path) -> None:
    """Two large evaluations whose phases each fit a pair's share check at once; one that does not fit waits for
    both slots, and a paired one that comes after it waits behind it (the turnstile), though a slot is free."""
    first, second, whole, late = (_gate(tmp_path, n) for n in ("p1", "p2", "whole", "late"))
    events: list[str] = []
    release_second = threading.Event()

    def second_holds() -> None:
        with second.large(paired=True):
            events.append("p2")
            release_second.wait(5)

    with first.large(paired=True):
        holder = threading.Thread(target=second_holds)
        holder.start()
        time.sleep(0.3)
        assert events == ["p2"]  # beside the first: no wait
        waiting_whole = _try(lambda: whole.large(paired=False), events, "whole")
        time.sleep(0.3)
        waiting_late = _try(lambda: late.large(paired=True), events, "late")
        time.sleep(0.3)
        assert events == ["p2"] and WAITING["whole"] and WAITING["late"]
        release_second.set()
        holder.join(5)
        time.sleep(0.3)
        assert events == ["p2"]  # a slot is free, but the whole one waits for both and the late one behind it
    waiting_whole.join(5)
    waiting_late.join(5)
    assert events == ["p2", "whole", "late"] and not WAITING["whole"] and not WAITING["late"]


def test_the_gate_counts_its_waits_and_what_it_held_alone_large_or_paired(tmp_path: Path) -> None:
    """A run's rate is bounded by what the gate runs one at a time: each gate counts the seconds its holder waited,
    held the GPU alone (timing, profile), held it as the one large evaluation or as one of a pair; ordinary shared
    holds overlap others' and are not counted."""
    reader, timer, big = (_gate(tmp_path, n) for n in ("r", "t", "big"))
    with reader.shared():
        writer = _try(timer.exclusive, [], "timing")
        deadline = time.monotonic() + 5
        while not WAITING["t"] and time.monotonic() < deadline:  # its wait has begun
            time.sleep(0.01)
        time.sleep(0.3)
    writer.join(5)
    assert 0.25 <= timer.spent["wait"] < 5 and reader.spent == {"wait": pytest.approx(0, abs=0.05), "alone": 0.0,
                                                                 "large": 0.0, "paired": 0.0}
    waited = timer.spent["wait"]
    with timer.exclusive():
        time.sleep(0.2)
    assert 0.2 <= timer.spent["alone"] < 2 and timer.spent["wait"] == pytest.approx(waited, abs=0.05)
    with big.large(paired=False):
        time.sleep(0.2)
    assert 0.2 <= big.spent["large"] < 2 and big.spent["alone"] == 0.0 and big.spent["paired"] == 0.0
    with big.large(paired=True):
        time.sleep(0.2)
    assert 0.2 <= big.spent["paired"] < 2 and big.spent["large"] < 2


def _context(tmp_path: Path, trials: int = 4, gated: bool = True) -> JudgeContext:
    """A judge's context on the CPU, its GPU's gate one of `_gate`'s (none where not `gated`)."""
    request, _ = example("2_relu", "2_relu__triton", check_hacks=False, correctness_trials=trials)
    link = SimpleNamespace()
    gpu = GpuPolicy(_gate(tmp_path, "j") if gated else None, torch.device("cpu"), link)  # type: ignore[arg-type]
    return JudgeContext(request, tmp_path, torch.device("cpu"), link, gpu)  # type: ignore[arg-type]


def _free_slots(tmp_path: Path) -> int:
    """How many large slots another evaluation could take now."""
    free = 0
    for slot in _gate(tmp_path, "other")._slots:
        try:
            fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        fcntl.flock(slot, fcntl.LOCK_UN)
        free += 1
    return free


@pytest.mark.parametrize(("large", "pairs"), [(True, False), (True, True), (False, False)])
def test_a_large_evaluation_holds_the_gpu_once_for_all_its_trials(tmp_path: Path, large: bool, pairs: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A large evaluation keeps its hold (and so both processes their memory) from its first correctness trial to
    its last, with no other large evaluation's trial in between, or only a paired one's where it pairs; an ordinary
    one holds the gate trial by trial."""
    ctx = _context(tmp_path)
    ctx.gpu.memory = MemoryClass(large, pairs)
    phase = CorrectnessPhase(ctx)
    holds: list[str] = []
    gated = ctx.gpu._gated

    @contextmanager
    def counted(phase, hold):  # type: ignore[no-untyped-def]
        holds.append(f"hold {phase}")
        with gated(phase, hold):
            yield

    def trial(*args: object) -> None:
        assert _free_slots(tmp_path) == (1 if pairs else 0 if large else 2)
        holds.append("trial")

    monkeypatch.setattr(ctx.gpu, "_gated", counted)
    monkeypatch.setattr(phase, "_trial", trial)
    phase.run(None)  # type: ignore[arg-type]
    assert holds == (["hold correctness"] + ["trial"] * 4 if large else ["hold correctness", "trial"] * 4)


@pytest.mark.parametrize("pairs", [True, False])
def test_a_large_evaluations_ablation_pairs_as_its_correctness_does(tmp_path: Path, pairs: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Ablation holds no more than the correctness phase's account: a large evaluation ablates with one large slot
    where its correctness phase pairs, with every slot where it does not; memory running out beside others' checks
    runs it again alone."""
    ctx = _context(tmp_path)
    ctx.gpu.memory = MemoryClass(True, pairs)
    phase = AblationPhase(ctx)
    timer = _gate(tmp_path, "t")
    seen: list[tuple[int, bool]] = []

    def ablation(reference: object) -> Ablation:
        seen.append((_free_slots(tmp_path), not _can_take(timer.shared)))
        if len(seen) == 1:
            raise OUT_OF_MEMORY
        return Ablation()

    monkeypatch.setattr(phase, "_ablate", ablation)
    outcome = ctx.gpu.shared_or_alone("ablation", functools.partial(phase.run, None))
    assert seen == [(1 if pairs else 0, False), (2, True)]  # beside ordinary checks; then the GPU alone
    assert outcome.notes == [f"ablation: the GPU's memory ran out beside other evaluations ({OUT_OF_MEMORY.message})"
                           ": run again alone"]


OUT_OF_MEMORY = Failure(Status.RUNTIME_ERROR, "OutOfMemoryError",
                        "CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 79.19 GiB")


@pytest.mark.parametrize("large", [True, False])
def test_memory_running_out_beside_others_is_checked_again_alone(tmp_path: Path, large: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of memory in a correctness trial while the GPU was shared may be another evaluation's doing: the phase is
    checked again from its first trial, holding the GPU exclusively (no other evaluation's checks, large or not),
    and that attempt decides; what the first attempt noted is said once."""
    ctx = _context(tmp_path, trials=3)
    ctx.gpu.memory = MemoryClass(large, large)
    phase = CorrectnessPhase(ctx)
    timer = _gate(tmp_path, "t")
    calls: list[tuple[int, bool]] = []

    def trial(reference: object, index: int, with_precision: bool, report: CorrectnessReport, *args: object) -> None:
        alone = not _can_take(timer.shared)
        calls.append((index, alone))
        report.notes.append(f"noted in trial {index}")
        report.hack(f"found_in_attempt_{len(calls) > 2 and 2 or 1}", f"trial {index}")
        if calls == [(0, False), (1, False)][: len(calls)] and index == 1:
            raise OUT_OF_MEMORY

    monkeypatch.setattr(phase, "_trial", trial)
    report = phase.run(None)  # type: ignore[arg-type]
    assert calls == [(0, False), (1, False), (0, True), (1, True), (2, True)]
    assert report.notes[0].startswith("correctness: the GPU's memory ran out beside other evaluations (CUDA out of")
    assert report.notes[1:] == [f"noted in trial {i}" for i in range(3)]
    # what the first attempt found stays found, before what the second found
    assert [(f.code, f.message) for f in report.findings] == [
        ("found_in_attempt_1", "trial 0"), ("found_in_attempt_1", "trial 1"),
        *(("found_in_attempt_2", f"trial {i}") for i in range(3))]


def _can_take(hold) -> bool:  # type: ignore[no-untyped-def]
    """Whether another evaluation could take this hold now (tried from a thread, given up after a moment)."""
    taken = threading.Event()

    def take() -> None:
        with hold():
            taken.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return taken.wait(0.3)


@pytest.mark.parametrize("failure", [
    OUT_OF_MEMORY,  # alone too: the candidate's own
    Failure(Status.INCORRECT, "Mismatch", "trial 0 (eval): 12 of 4096 elements differ"),  # not a matter of memory
])
def test_only_memory_running_out_beside_others_is_checked_again(tmp_path: Path, failure: Failure,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked again alone, memory that runs out again is the candidate's: that is the verdict; any other failure is
    the verdict at once."""
    phase = CorrectnessPhase(_context(tmp_path, trials=2))
    attempts: list[int] = []

    def trial(reference: object, index: int, *args: object) -> None:
        attempts.append(index)
        raise failure

    monkeypatch.setattr(phase, "_trial", trial)
    with pytest.raises(Failure) as raised:
        phase.run(None)  # type: ignore[arg-type]
    assert raised.value is failure
    assert attempts == ([0, 0] if failure.kind == "OutOfMemoryError" else [0])


def test_without_a_gate_an_evaluation_has_the_gpu_alone_and_is_not_checked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    phase = CorrectnessPhase(_context(tmp_path, trials=2, gated=False))
    attempts: list[int] = []

    def trial(reference: object, index: int, *args: object) -> None:
        attempts.append(index)
        raise OUT_OF_MEMORY

    monkeypatch.setattr(phase, "_trial", trial)
    with pytest.raises(Failure):
        phase.run(None)  # type: ignore[arg-type]
    assert attempts == [0]


GIB = 2**30
H100 = 79.19 * GIB


@pytest.mark.parametrize(("inputs", "outputs", "large", "pairs"), [
    (0.25 * GIB, 0.25 * GIB, False, False),  # 88_MinGPTNewGelu: ordinary
    (6 * GIB, 6 * GIB, True, True),  # 19_ReLU: measured 36.5 GiB at 1/16 of the GPU for float64, about 32.8 now
    (8 * GIB, 0.002 * GIB, True, True),  # 47_Sum_reduction: measured 28.4 GiB
    (7 * GIB, 7 * GIB, True, False),  # 36_RMSNorm_: measured 41.4 GiB, about 37.8 now: one at a time
    (6 * GIB, None, True, False),  # outputs unknown: not beside another
    (None, None, True, False),  # inputs unknown: large, alone
])
def test_which_evaluations_are_large_and_which_pair(inputs: int | None, outputs: int | None, large: bool,
                                                   pairs: bool) -> None:
    assert memory_class(inputs, outputs, int(H100)) == MemoryClass(large, pairs)


def test_a_references_sizes_come_from_the_meta_device() -> None:
    """Inputs and outputs sized without allocating them (6 GiB each here); None for what meta cannot run."""
    module = SimpleNamespace(
        get_inputs=lambda: [torch.rand(4096, 393216)], get_init_inputs=lambda: [],
        Model=lambda: (lambda x: torch.relu(x)))
    assert sizes_on_meta(module) == (6 * GIB, 6 * GIB)
    module.Model = lambda: (lambda x: x.sum().item())  # .item() has no value on meta
    assert sizes_on_meta(module) == (6 * GIB, None)
    module.get_inputs = lambda: [torch.rand(2).max().item()]
    assert sizes_on_meta(module) == (None, None)


@pytest.mark.slow
def test_evaluation_waits_at_the_gate_without_timing_out(tmp_path: Path) -> None:
    """Another evaluation holds the GPU shared (its correctness checks): this one's correctness runs meanwhile,
    its timing waits; then one holds it exclusively (its timing) for longer than this one's whole time limit:
    the wait is not counted against it."""
    supervisor = Supervisor(device="cpu", root=tmp_path, overlap=2)
    try:
        request, expected = example("2_relu", "2_relu__triton", timeout_s=4, measure_performance=True,
                                    perf_trials=2, warmup_trials=1)
        other = DeviceGate(supervisor.gate)
        with other.shared():
            done = DeviceQueue(supervisor).submit(request)
            time.sleep(6)  # longer than the time limit: the evaluation's correctness ran, its timing waits
            assert not done.done()
        result = done.result(60)
        assert result.status == expected == Status.CORRECT.value
        assert result.phases_s["correctness"] > 0 and result.phases_s["gpu_wait"] > 2
        # the gate's own account: every wait (the one before timing among them), timing and profile held alone
        assert result.phases_s["gate_wait"] >= result.phases_s["gpu_wait"] - 0.01
        assert 0 < result.phases_s["gate_alone"] < result.duration_s and result.phases_s["gate_large"] == 0
    finally:
        supervisor.close()


# Appended to a correct candidate: its first forward raises CUDA's out-of-memory error, as another evaluation's memory
# would make it, and every later one computes.
RUNS_OUT_ONCE = '''
import torch as _torch

_calls = [0]
_forward = ModelNew.forward


def _runs_out_once(self, *args):
    _calls[0] += 1
    if _calls[0] == 1:
        raise _torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (drkernel-test)")
    return _forward(self, *args)


ModelNew.forward = _runs_out_once
'''


@pytest.mark.parametrize("overlap", [2, 1])
def test_an_evaluation_whose_memory_ran_out_beside_others_is_checked_again_alone(tmp_path: Path,
                                                                                overlap: int) -> None:
    """Through the real processes: beside others (a gate), memory that ran out in the first correctness trial is
    checked again alone and the verdict is the second attempt's, with a note; alone on its device (no gate), it is
    the candidate's `runtime_error`."""
    device = os.environ.get("DRKERNEL_TEST_DEVICE", "cpu")
    request, expected = example("2_relu", "2_relu__triton", device=device, memory_limit_mb=4096)
    request = dataclasses.replace(request, candidate=request.candidate + RUNS_OUT_ONCE)
    supervisor = Supervisor(device=device, gpu="0" if device == "cuda" else None, root=tmp_path, overlap=overlap)
    try:
        result = DeviceQueue(supervisor).submit(request).result(120)
    finally:
        supervisor.close()
    again = [n for n in result.notes if "ran out beside other evaluations" in n]
    if overlap > 1:
        assert result.status == expected == Status.CORRECT.value, result.error
        assert again and "(drkernel-test)" in again[0] and again[0].endswith("run again alone")
        assert result.correctness is not None and result.correctness.passed_trials == result.correctness.trials
    else:
        assert result.status == Status.RUNTIME_ERROR.value and not again
        assert result.error is not None and result.error.kind == "OutOfMemoryError"
