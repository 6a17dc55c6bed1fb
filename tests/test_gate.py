"""The per-GPU device gate: correctness checks of several evaluations may overlap, timing and profiling never do,
and an evaluation waiting for the GPU is not timed out for it."""

from __future__ import annotations

import fcntl
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from drkernel.runner.sandbox import DeviceQueue, Sandbox
from drkernel.sandbox import guards
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.judge import Judge
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
    """An evaluation large in memory checks correctness beside ordinary ones, but a second large one waits for it,
    and it keeps its hold through a compilation: no timing runs while its memory is taken."""
    big, other_big, small, timer = (_gate(tmp_path, n) for n in ("big", "big2", "s", "t"))
    events: list[str] = []
    synced: list[int] = []
    with big.large():
        with small.shared():  # an ordinary check at the same time: no wait
            events.append("small")
        second = _try(other_big.large, events, "big2")
        big.pause(lambda: synced.append(1))  # compiling: the hold is kept
        writer = _try(timer.exclusive, events, "timing")
        time.sleep(0.3)
        assert events == ["small"] and synced == [] and WAITING["big2"] and WAITING["t"]
        big.resume()
    second.join(5)
    writer.join(5)
    assert sorted(events[1:]) == ["big2", "timing"] and not WAITING["big2"] and not WAITING["t"]


def test_the_gate_counts_its_waits_and_what_it_held_alone_or_as_the_large_one(tmp_path: Path) -> None:
    """A run's rate is bounded by what the gate runs one at a time: each gate counts the seconds its holder waited,
    held the GPU alone (timing, profile) and held it as the one large evaluation; ordinary shared holds overlap
    others' and are not counted."""
    reader, timer, big = (_gate(tmp_path, n) for n in ("r", "t", "big"))
    with reader.shared():
        writer = _try(timer.exclusive, [], "timing")
        deadline = time.monotonic() + 5
        while not WAITING["t"] and time.monotonic() < deadline:  # its wait has begun
            time.sleep(0.01)
        time.sleep(0.3)
    writer.join(5)
    assert 0.25 <= timer.spent["wait"] < 5 and reader.spent == {"wait": pytest.approx(0, abs=0.05), "alone": 0.0,
                                                                 "large": 0.0}
    waited = timer.spent["wait"]
    with timer.exclusive():
        time.sleep(0.2)
    assert 0.2 <= timer.spent["alone"] < 2 and timer.spent["wait"] == pytest.approx(waited, abs=0.05)
    with big.large():
        time.sleep(0.2)
    assert 0.2 <= big.spent["large"] < 2 and big.spent["alone"] == 0.0


@pytest.mark.parametrize("large", [True, False])
def test_a_large_evaluation_holds_the_gpu_once_for_all_its_trials(tmp_path: Path, large: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A large evaluation keeps its hold (and so both processes their memory) from its first correctness trial to
    its last, with no other large evaluation's trial in between; an ordinary one holds the gate trial by trial."""
    request, _ = example("2_relu", "2_relu__triton", check_hacks=False, correctness_trials=4)
    link = SimpleNamespace(findings=guards.Findings())
    judge = Judge(request, tmp_path, torch.device("cpu"), _gate(tmp_path, "j"), link)  # type: ignore[arg-type]
    judge.large = large
    holds: list[str] = []
    gated = judge._gated

    @contextmanager
    def counted(phase, hold):  # type: ignore[no-untyped-def]
        holds.append(f"hold {phase}")
        with gated(phase, hold):
            yield

    def trial(*args: object) -> None:
        if large:  # another large evaluation is shut out during every trial
            with pytest.raises(BlockingIOError):
                fcntl.flock(_gate(tmp_path, "other")._large, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holds.append("trial")

    monkeypatch.setattr(judge, "_gated", counted)
    monkeypatch.setattr(judge, "_correctness_trial", trial)
    judge.check_correctness(None)  # type: ignore[arg-type]
    assert holds == (["hold correctness"] + ["trial"] * 4 if large else ["hold correctness", "trial"] * 4)


@pytest.mark.slow
def test_evaluation_waits_at_the_gate_without_timing_out(tmp_path: Path) -> None:
    """Another evaluation holds the GPU shared (its correctness checks): this one's correctness runs meanwhile,
    its timing waits; then one holds it exclusively (its timing) for longer than this one's whole time limit:
    the wait is not counted against it."""
    sandbox = Sandbox(device="cpu", root=tmp_path, overlap=2)
    try:
        request, expected = example("2_relu", "2_relu__triton", timeout_s=4, measure_performance=True,
                                    perf_trials=2, warmup_trials=1)
        other = DeviceGate(sandbox.gate)
        with other.shared():
            done = DeviceQueue(sandbox).submit(request)
            time.sleep(6)  # longer than the time limit: the evaluation's correctness ran, its timing waits
            assert not done.done()
        result = done.result(60)
        assert result.status == expected == Status.CORRECT.value
        assert result.phases_s["correctness"] > 0 and result.phases_s["gpu_wait"] > 2
        # the gate's own account: every wait (the one before timing among them), timing and profile held alone
        assert result.phases_s["gate_wait"] >= result.phases_s["gpu_wait"] - 0.01
        assert 0 < result.phases_s["gate_alone"] < result.duration_s and result.phases_s["gate_large"] == 0
    finally:
        sandbox.close()
