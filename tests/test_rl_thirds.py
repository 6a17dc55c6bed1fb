"""benchmarks/rl_thirds.py: first answers' Fast@1.2 of the first third of steps against the last, pooled over
replicates, with a bootstrap interval over prompts."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def rl_thirds():
    return load_script("benchmarks/rl_thirds.py")


def _samples(path, fast_by_step, tasks=("a", "b")):
    """Six steps, two prompts a step, two samples a prompt; a first answer is fast where fast_by_step says, later
    turns are never fast (they must not count)."""
    rows = [{"step": step, "task": f"{task}{step}", "turn": turn, "sample": sample, "correct": fast or turn > 1,
             "speedup": 2.0 if fast or turn > 1 else 0.5}
            for step, fast in fast_by_step.items() for task in tasks for sample in (0, 1) for turn in (1, 2)]
    with gzip.open(path, "wt") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def test_pooled_thirds_and_their_interval(rl_thirds, tmp_path, capsys):
    rising = _samples(tmp_path / "a.jsonl.gz", {1: False, 2: False, 3: False, 4: True, 5: True, 6: True})
    flat = _samples(tmp_path / "b.jsonl.gz", {1: True, 2: False, 3: True, 4: False, 5: True, 6: False})
    rl_thirds.main([str(rising), str(flat), "--draws", "500"])
    out = json.loads(capsys.readouterr().out)
    assert out["runs"][str(rising)] == {"first_third": 0.0, "last_third": 1.0}  # steps 1-2 against 5-6
    assert out["runs"][str(flat)] == {"first_third": 0.5, "last_third": 0.5}
    pooled = out["pooled"]
    assert pooled["prompts"] == [8, 8] and pooled["answers"] == [16, 16]
    assert (pooled["first_third"], pooled["last_third"], pooled["difference"]) == (0.25, 0.75, 0.5)
    low, high = pooled["interval"]
    assert 0.0 < low < 0.5 < high <= 1.0


def test_last_turns_and_best_of_history(rl_thirds, tmp_path, capsys):
    """Later turns count by trajectory: each (prompt, sample) is one answer, its last turn or any of its turns."""
    rows = []
    for step in range(1, 7):
        late = step > 4  # in the last third, sample 0 ends fast; sample 1 is fast at turn 1 only, in every step
        for sample, fast_by_turn in ((0, (False, late)), (1, (True, False))):
            rows += [{"step": step, "task": f"t{step}", "turn": turn, "sample": sample, "correct": fast,
                      "speedup": 2.0 if fast else 0.5} for turn, fast in enumerate(fast_by_turn, 1)]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    shares = {}
    for measure in ("first", "last", "best"):
        rl_thirds.main([str(path), "--measure", measure, "--draws", "200"])
        out = json.loads(capsys.readouterr().out)
        assert out["measure"] == measure and out["pooled"]["answers"] == [4, 4]  # two trajectories, two steps
        shares[measure] = out["runs"][str(path)]
    assert shares["first"] == {"first_third": 0.5, "last_third": 0.5}
    assert shares["last"] == {"first_third": 0.0, "last_third": 0.5}
    assert shares["best"] == {"first_third": 0.5, "last_third": 1.0}
    path.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "sample"}) + "\n" for row in rows))
    with pytest.raises(SystemExit, match="--measure last needs each turn's `sample`"):
        rl_thirds.main([str(path), "--measure", "last"])


def test_a_run_too_short_or_missing_is_refused(rl_thirds, tmp_path):
    short = _samples(tmp_path / "short.jsonl.gz", {1: True, 2: False})
    with pytest.raises(SystemExit, match="2 steps has no thirds"):
        rl_thirds.main([str(short)])
    with pytest.raises(SystemExit, match="no such file"):
        rl_thirds.main([str(tmp_path / "absent.jsonl")])
    metrics = tmp_path / "metrics.jsonl"  # a run's other file: steps, no turns
    metrics.write_text('{"step": 1, "reward_mean": 0.5}\n')
    with pytest.raises(SystemExit, match=r"metrics.jsonl:1: not a judged turn .*needs step, task, turn"):
        rl_thirds.main([str(metrics)])
    metrics.write_text('{"step": 1, "task": "a", "turn": 1}\n{"step":\n')
    with pytest.raises(SystemExit, match=r"metrics.jsonl:2: not JSON"):
        rl_thirds.main([str(metrics)])
