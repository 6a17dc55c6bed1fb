"""The hierarchical bootstrap over seeds and tasks (drkernel.report.seeds) on synthetic bench runs whose answer is
known, the distinct-answer counts of the kinds table, and both through `drkernel report`."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.cli.main import app
from drkernel.report.metrics import Trajectories, answer_kinds, task_intervals
from drkernel.report.runs import Turn
from drkernel.report.seeds import has_seeds, method_and_seed, seed_analysis
from drkernel.rl.metrics import last_turn_fast

TASKS = [f"task_{i}" for i in range(12)]
SAMPLES = 4


def _turn(task: str, sample: int, turn: int, fast: bool, code: str | None = None) -> Turn:
    return Turn(task=task, level=None, sample=sample, turn=turn, status="correct" if fast else "incorrect",
                correct=fast, speedup=2.0 if fast else 0.5, coverage=float("nan"), hack_reasons=(), reward=0.0,
                code=code if code is not None else f"{task} {sample} {turn}", interpreter=False)


def _run(fast_samples: dict[str, int], turns: int = 2) -> Trajectories:
    """Every task with SAMPLES samples of `turns` turns; the first fast_samples[task] samples fast at every turn."""
    return Trajectories.of([_turn(task, s, t, s < fast_samples[task]) for task in TASKS for s in range(SAMPLES)
                            for t in range(1, turns + 1)])


def _shares(seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    return {task: rng.randint(0, SAMPLES - 1) for task in TASKS}  # at most 3 of 4: one more still fits


def _row(analysis, method: str, measure: str = "Fast@1.2"):
    (row,) = [r for r in analysis.rows if r.method == method and r.measure == measure]
    return row


def _width(estimate) -> float:
    return estimate.interval[1] - estimate.interval[0]


def test_names_give_method_and_seed():
    assert method_and_seed("recipe-s12") == ("recipe", "12") and method_and_seed("sft") == ("sft", "-")
    assert method_and_seed("grpo-sx") == ("grpo-sx", "-")
    assert has_seeds(["sft", "recipe-s1", "recipe-s2"]) and not has_seeds(["sft", "recipe-s1", "grpo-s1"])


def test_one_seed_is_exactly_the_bootstrap_over_tasks():
    traj = _run(_shares(0))
    analysis = seed_analysis([("sft", traj)])
    hits = last_turn_fast(traj.speedup, traj.correct, 1.2, traj.reached)
    expected = task_intervals(hits, [task for task, _ in traj.keys])
    row = _row(analysis, "sft")
    assert row.seeds == ("-",) and row.tasks == len(TASKS)
    assert [estimate.interval for estimate in row.turns] == expected
    assert row.turns[0].value == pytest.approx(sum(_shares(0).values()) / (SAMPLES * len(TASKS)))


def test_seed_variance_widens_the_interval_and_identical_seeds_do_not():
    base = _shares(0)
    calm = [(f"calm-s{s}", _run(base)) for s in (1, 2, 3)]  # three seeds that landed alike
    all_or_none = [{task: 0 for task in TASKS}, base, {task: SAMPLES for task in TASKS}]
    noisy = [(f"noisy-s{s}", _run(shares)) for s, shares in zip((1, 2, 3), all_or_none)]
    analysis = seed_analysis(calm + noisy + [("one", _run(base))])
    calm_last, noisy_last, one_last = (_row(analysis, m).turns[-1] for m in ("calm", "noisy", "one"))
    # seeds that do not differ add nothing: the task bootstrap of one of them, to the draw
    assert calm_last.interval == pytest.approx(one_last.interval, abs=1e-12)
    assert _width(noisy_last) > 2 * _width(calm_last)
    assert noisy_last.value == pytest.approx((0 + calm_last.value + 1) / 3)
    assert noisy_last.interval[0] < calm_last.value < noisy_last.interval[1]


def test_differences_are_paired_by_task_and_by_seed():
    seeds = (1, 2, 3)
    before = {s: _shares(s) for s in seeds}
    a = [(f"a-s{s}", _run(before[s])) for s in seeds]
    b = [(f"b-s{s}", _run({task: n + 1 for task, n in before[s].items()})) for s in seeds]  # one more fast sample
    c = [(f"c-s{s + 3}", _run({task: n + 1 for task, n in before[s].items()})) for s in seeds]  # other seeds
    analysis = seed_analysis(a + b + c)
    (b_a,) = [d for d in analysis.differences if (d.method, d.against, d.measure) == ("b", "a", "Fast@1.2")]
    assert b_a.paired_by_seed
    for estimate in (*b_a.turns, b_a.best):  # every draw: the same tasks and seeds, one sample in four more
        assert estimate.value == pytest.approx(0.25)
        assert estimate.interval == pytest.approx((0.25, 0.25))
    (c_a,) = [d for d in analysis.differences if (d.method, d.against, d.measure) == ("c", "a", "Fast@1.2")]
    assert not c_a.paired_by_seed and c_a.turns[-1].value == pytest.approx(0.25)
    assert _width(c_a.turns[-1]) > 0.02  # seeds drawn apart: the seeds' spread enters the difference
    # correct rate and Fast@1 come with it; the pairs go each method against every one before it
    assert {(d.method, d.against) for d in analysis.differences} == {("b", "a"), ("c", "a"), ("c", "b")}
    assert {r.measure for r in analysis.rows} == {"correct", "Fast@1", "Fast@1.2", "distinct answers"}


def test_distinct_answers_show_a_collapse():
    collapsed = [_turn("task_0", s, 1, True, code="one answer\n") for s in range(SAMPLES)]
    varied = [_turn("task_1", s, 1, False) for s in range(SAMPLES)]
    traj = Trajectories.of(collapsed + varied)
    kinds = answer_kinds("run", traj)
    assert (kinds.distinct, kinds.alike) == ([1 + SAMPLES], [1])
    row = _row(seed_analysis([("run", traj)]), "run", "distinct answers")
    assert row.turns[0].value == pytest.approx((1 / SAMPLES + 1) / 2) and row.best is None


def _write_bench(folder: Path, shares: dict[str, int]) -> None:
    folder.mkdir(parents=True)
    rows = [{"task": task, "level": None, "sample": s, "turn": t, "reward": 0.0, "code": f"answer {s}",
             "status": "correct" if s < shares[task] else "incorrect",
             "result": {"correct": s < shares[task], "speedup": 2.0 if s < shares[task] else 0.5}}
            for task in TASKS for s in range(SAMPLES) for t in (1, 2)]
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_report_adds_the_seed_tables_when_a_method_has_seeds(tmp_path):
    for name, seed in (("sft", 0), ("recipe-s1", 1), ("recipe-s2", 2), ("grpo-s1", 3), ("grpo-s2", 4)):
        _write_bench(tmp_path / "bench" / name, _shares(seed))
    runs = [str(tmp_path / "bench" / name) for name in ("sft", "grpo-s1", "grpo-s2", "recipe-s1", "recipe-s2")]
    result = CliRunner().invoke(app, ["report", *runs, "--out", str(tmp_path / "report"), "--no-paper"])
    assert result.exit_code == 0, result.output
    with (tmp_path / "report" / "tables" / "seeds.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["method"], r["seeds"]) for r in rows if r["measure"] == "Fast@1.2"] == [
        ("sft", "-"), ("grpo", "1, 2"), ("recipe", "1, 2")]
    with (tmp_path / "report" / "tables" / "seed_differences.csv").open() as handle:
        differences = [r for r in csv.DictReader(handle) if r["measure"] == "Fast@1.2"]
    assert [(r["method"], r["against"], r["paired by"]) for r in differences] == [
        ("grpo", "sft", "tasks"), ("recipe", "sft", "tasks"), ("recipe", "grpo", "tasks and seeds")]
    assert all(r["last turn: 95% interval excludes 0"] in ("yes, above", "yes, below", "no") for r in differences)
    assert "### Per method over its seeds" in (tmp_path / "report" / "report.md").read_text()
    with (tmp_path / "report" / "tables" / "kinds.csv").open() as handle:
        kinds = list(csv.DictReader(handle))
    assert {r["distinct answers"] for r in kinds} == {str(SAMPLES)}  # every task answers "answer 0".."answer 3"
    assert {r["tasks answered alike"] for r in kinds} == {"0"}
    # one seed a method: no seed tables
    single = CliRunner().invoke(app, ["report", *runs[:2], "--out", str(tmp_path / "single"), "--no-paper"])
    assert single.exit_code == 0 and not (tmp_path / "single" / "tables" / "seeds.csv").exists()
