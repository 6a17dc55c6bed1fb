"""Reading run directories: a bench run's trajectories.jsonl (with config.json, summary.json and
generation_errors.jsonl) and a training run's metrics.jsonl with the bench runs of its validation steps
(validation/step_N/).

The records are read as plain dicts against the agent contract (docs/report.md), so extra fields written by a newer
loop do no harm. A run may still be going while it is read: a last line without its newline is skipped with a note,
and a missing summary.json is noted, never an error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drkernel.agent.records import GENERATION_ERRORS, TRAJECTORIES, read_jsonl_lines
from drkernel.errors import UsageError
from drkernel.rl import AnswerKind, answer_kind, measured_coverage
from drkernel.sandbox.timing import slow, slow_calls

METRICS = "metrics.jsonl"
REQUIRED_FIELDS = ("task", "level", "sample", "turn", "status", "result", "reward", "code")


class RunReadError(UsageError):
    """A run directory or one of its files cannot be used; the message names the file and the line."""


@dataclass(frozen=True)
class Turn:
    """One judged turn, reduced to what the report uses."""

    task: str
    level: int | None
    sample: int
    turn: int
    status: str  # the result's status, or "format_error"
    correct: bool
    speedup: float  # NaN when not measured
    coverage: float  # NaN when not measured meaningfully (no GPU)
    hack_reasons: tuple[str, ...]
    reward: float
    code: str | None
    interpreter: bool  # timed under Triton's interpreter: the speedup says nothing of GPU speed
    kind: str = AnswerKind.FAILED.value  # lazy, partial, unfused, fused, unmeasured or failed (drkernel.rl.kinds)
    # where the turn's time went, in seconds: the evaluation's phases (a judged, not cached, result's `phases_s` and
    # `duration_s` as "duration") and the agent's `timings` (generation, and the wait for the verdict)
    seconds: tuple[tuple[str, float], ...] = ()
    # a result judged here (not cached) with GPU timings: how many measurements the judge made (0: none here), and
    # the sides whose median timed call was a slow one (drkernel.sandbox.timing.slow: the call waited for something)
    measurements: int = 0
    slow_medians: tuple[str, ...] = ()
    # the candidate's timed calls, the slow ones among them, and of those the ones whose host blocked in the kernel
    # while it enqueued them (`timing.candidate.host_interruptions`) and those during which the allocator took memory
    # from the driver (`timing.candidate.driver_allocations`); 0 where a record has none
    calls: int = 0
    slow_calls: int = 0
    slow_calls_blocked: int = 0
    slow_calls_allocating: int = 0


@dataclass
class Run:
    name: str
    path: Path
    turns: list[Turn]
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)  # a training run's metrics.jsonl
    notes: list[str] = field(default_factory=list)
    validation_step: int | None = None  # a training run's turns come from this validation step

    @property
    def turns_name(self) -> str:
        """The name of the turns' rows and lines: a training run's says which validation step they come from."""
        return self.name if self.validation_step is None else f"{self.name} (validation, step {self.validation_step})"


def read_run(path: str | Path) -> Run:
    """A bench run (trajectories.jsonl) or a training run (metrics.jsonl, whose turns come from its newest
    validation step with records); a folder with both is read as both."""
    folder = Path(path)
    if not folder.is_dir():
        raise RunReadError(f"{folder}: not a folder")
    trained = (folder / METRICS).is_file()
    if (folder / TRAJECTORIES).is_file():
        run = _bench_run(folder, folder.name)
    elif trained:
        run = _latest_validation(folder)
    else:
        raise RunReadError(f"{folder}: neither {TRAJECTORIES} (a bench run) nor {METRICS} (a training run)")
    if trained:
        rows, notes = read_jsonl(folder / METRICS)
        for line, row in rows:
            if not isinstance(row.get("step"), int):
                raise RunReadError(f"{folder / METRICS}:{line}: missing required field 'step' (an integer)")
        run.steps, run.notes = [row for _, row in rows], run.notes + notes
    return run


# Settings that may differ between the runs of a pool: they name the policy and where it was asked, not how.
POOL_FREE_SETTINGS = ("model", "base_url", "api_key_env")


def pool_runs(name: str, paths: Sequence[str | Path]) -> Run:
    """Bench runs of one setting (replicates: one RL run per seed, each benched alike) read as one run: every run's
    samples of a task become samples of the pooled run, numbered on after the previous run's, so a task's share is
    the mean of the runs' shares when they hold as many samples each. Tables, intervals over tasks and the paired
    differences against another run then treat the replicates as one policy (docs/report.md)."""
    if not name.strip():
        raise RunReadError("a pool needs a name: NAME=DIR,DIR,...")
    if len(paths) < 2:
        raise RunReadError(f"pool {name!r}: pooling takes at least two bench runs, got {len(paths)}")
    runs = [read_run(path) for path in paths]
    for run in runs:
        if run.steps or not run.turns:
            raise RunReadError(f"pool {name!r}: {run.path} is not a bench run with judged turns")
    turns, notes, offset = [], [f"pooled from {len(runs)} bench runs: {', '.join(str(r.path) for r in runs)}"], 0
    for run in runs:
        turns += [dataclasses.replace(t, sample=t.sample + offset) for t in run.turns]
        offset += max(t.sample for t in run.turns) + 1
        notes += [f"{run.path.name}: {note}" for note in run.notes]
    first = runs[0].config
    differ = sorted({key for run in runs[1:] for key in {*first, *run.config} - set(POOL_FREE_SETTINGS)
                     if first.get(key) != run.config.get(key)})
    if differ:
        notes.append(f"the pooled runs differ in {', '.join(differ)}: they may not be replicates of one setting")
    return Run(name, runs[0].path, turns, first, None, notes=notes)


def _latest_validation(folder: Path) -> Run:
    validations = sorted(
        (int(m.group(1)), d) for d in (folder / "validation").glob("step_*")
        if (m := re.fullmatch(r"step_(\d+)", d.name)) and (d / TRAJECTORIES).is_file()
    )
    if not validations:
        run = Run(name=folder.name, path=folder, turns=[], config=_read_json(folder / "config.json") or {})
        run.notes.append("no validation records yet: training curves only")
        return run
    step, latest = validations[-1]
    run = _bench_run(latest, folder.name)
    run.path, run.validation_step = folder, step
    run.notes.insert(0, f"tables and turn figures from the validation records of step {step} ({latest})")
    return run


def _bench_run(folder: Path, name: str) -> Run:
    rows, notes = read_jsonl(folder / TRAJECTORIES)
    turns = [_turn(row, folder / TRAJECTORIES, line) for line, row in rows]
    seen: dict[tuple[str, int, int], int] = {}
    for (line, _), turn in zip(rows, turns):
        key = (turn.task, turn.sample, turn.turn)
        if key in seen:
            raise RunReadError(
                f"{folder / TRAJECTORIES}:{line}: task {turn.task!r} sample {turn.sample} turn {turn.turn} "
                f"was already recorded on line {seen[key]}"
            )
        seen[key] = line
    notes += _missing_turns_note(folder, set(seen))
    summary = _read_json(folder / "summary.json")
    if summary is None:
        notes.append("no summary.json: the run may still be going")
    return Run(name, folder, turns, _read_json(folder / "config.json") or {}, summary, notes=notes)


def _missing_turns_note(folder: Path, recorded: set[tuple[str, int, int]]) -> list[str]:
    """A note when model calls failed for good and their turns are still missing: those trajectories stop early."""
    path = folder / GENERATION_ERRORS
    if not path.is_file():
        return []
    rows, notes = read_jsonl(path)
    missing = {(row.get("task"), row.get("sample"), row.get("turn")) for _, row in rows} - recorded
    if missing:
        notes.append(f"{len(missing)} turn(s) missing because the model call failed for good ({GENERATION_ERRORS}): "
                     f"their trajectories stop early; `drkernel bench --out {folder} --resume` asks them again")
    return notes


def read_jsonl(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """(1-based line number, object) of each non-empty line, and notes; a partial last line is skipped."""
    try:
        rows, partial = read_jsonl_lines(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise RunReadError(f"cannot read {path}: {exc}") from exc
    except ValueError as exc:  # a line other than the last is not JSON
        raise RunReadError(str(exc)) from exc
    for number, row in rows:
        if not isinstance(row, dict):
            raise RunReadError(f"{path}:{number}: expected a JSON object, not {type(row).__name__}")
    notes = [] if partial is None else [
        f"{path.name}: skipped the partial last line {partial} (the run is still being written)"]
    return rows, notes


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunReadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise RunReadError(f"{path}: expected a JSON object, not {type(data).__name__}")
    return data


def _turn(row: dict[str, Any], path: Path, line: int) -> Turn:
    missing = [name for name in REQUIRED_FIELDS if name not in row]
    if missing:
        raise RunReadError(f"{path}:{line}: missing required field(s) {', '.join(map(repr, missing))}")

    def bad(name: str, expected: str) -> RunReadError:
        return RunReadError(f"{path}:{line}: field {name!r} must be {expected}, not {row[name]!r}")

    if not isinstance(row["task"], str) or not row["task"]:
        raise bad("task", "a non-empty string")
    if row["level"] is not None and (not isinstance(row["level"], int) or isinstance(row["level"], bool)):
        raise bad("level", "an integer or null")
    if not isinstance(row["sample"], int) or row["sample"] < 0:
        raise bad("sample", "an integer >= 0")
    if not isinstance(row["turn"], int) or row["turn"] < 1:
        raise bad("turn", "an integer >= 1")
    if not isinstance(row["status"], str):
        raise bad("status", "a string")
    if not isinstance(row["reward"], (int, float)):
        raise bad("reward", "a number")
    if row["code"] is not None and not isinstance(row["code"], str):
        raise bad("code", "a string or null")
    result = row["result"]
    if result is not None and not isinstance(result, dict):
        raise bad("result", "an EvalResult object or null")
    result = result or {}
    coverage = measured_coverage(result.get("profile"))
    return Turn(
        task=row["task"],
        level=row["level"],
        sample=row["sample"],
        turn=row["turn"],
        status=row["status"],
        correct=bool(result.get("correct", False)),
        speedup=_number(result.get("speedup")),
        coverage=_number(coverage),
        hack_reasons=tuple(result.get("hack_reasons") or ()),
        reward=float(row["reward"]),
        code=row["code"],
        interpreter=bool((result.get("environment") or {}).get("interpreter", False)),
        kind=answer_kind(result).value,
        seconds=_seconds(row, result),
        **_gpu_timing(result),
    )


def _gpu_timing(result: dict[str, Any]) -> dict[str, Any]:
    """`measurements`, `slow_medians` and the candidate's slow calls (`calls`, `slow_calls`, `slow_calls_blocked`,
    `slow_calls_allocating`) of a result judged in the run with CUDA event timings."""
    timing = result.get("timing") if isinstance(result.get("timing"), dict) else None
    if result.get("cached") or not timing:
        return {}
    sides = {side: timing.get(side) for side in ("reference", "candidate") if isinstance(timing.get(side), dict)}
    if not sides or any(stats.get("method") != "cuda_event" for stats in sides.values()):
        return {}
    measurements = timing.get("measurements", 1)
    samples = sides.get("candidate", {}).get("samples_ms")
    samples = samples if isinstance(samples, list) and all(isinstance(v, (int, float)) for v in samples) else []
    candidate = sides.get("candidate", {})
    slowed = slow_calls(samples)
    return {"measurements": measurements if isinstance(measurements, int) and measurements > 0 else 1,
            "slow_medians": tuple(side for side, stats in sides.items()
                                  if all(isinstance(stats.get(k), (int, float)) for k in ("median_ms", "min_ms"))
                                  and slow(stats["median_ms"], stats["min_ms"])),
            "calls": len(samples), "slow_calls": len(slowed),
            # blocked: a voluntary context switch, the first of the call's [voluntary, involuntary, faults]
            "slow_calls_blocked": _slow_and(slowed, candidate.get("host_interruptions"),
                                            lambda counts: isinstance(counts, list) and bool(counts)
                                            and _positive_count(counts[0])),
            "slow_calls_allocating": _slow_and(slowed, candidate.get("driver_allocations"), _positive_count)}


def _slow_and(slowed: list[int], per_call: Any, counted: Callable[[Any], bool]) -> int:
    """How many of the slow calls (their indices) a per-call record counts; a record that is not a list counts
    none (records are read as written, by older versions too)."""
    values = per_call if isinstance(per_call, list) else []
    return sum(1 for i in slowed if i < len(values) and counted(values[i]))


def _positive_count(value: Any) -> bool:
    return isinstance(value, int) and value > 0


def _seconds(row: dict[str, Any], result: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    timings = row.get("timings") if isinstance(row.get("timings"), dict) else {}
    spent: dict[str, Any] = {"generation": timings.get("generation_s")}
    if result and not result.get("cached"):  # judged here: a cached verdict took no evaluation
        spent.update(result.get("phases_s") if isinstance(result.get("phases_s"), dict) else {})
        spent.update(duration=result.get("duration_s"), evaluation=timings.get("evaluation_s"))
    return tuple((name, float(value)) for name, value in spent.items()
                 if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
