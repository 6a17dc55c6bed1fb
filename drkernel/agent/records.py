"""A run directory: `trajectories.jsonl` (one line per judged turn), `generation_errors.jsonl` (one line per model
call that failed for good: not a turn, so `--resume` asks that turn again), `config.json` and `summary.json`.

A turn is appended, flushed and synced as soon as it is judged, so a killed run loses at most the turns in flight
and `--resume` rebuilds every trajectory from these lines alone. A kill in the middle of a write leaves a partial
last line: readers skip it and the next writer cuts it off before appending.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO, TypeVar

from drkernel.errors import UsageError

TRAJECTORIES = "trajectories.jsonl"
GENERATION_ERRORS = "generation_errors.jsonl"
CONFIG = "config.json"
SUMMARY = "summary.json"

FORMAT_ERROR = "format_error"  # the answer had no code block defining ModelNew


Record = TypeVar("Record", bound="JsonRecord")


class JsonRecord:
    """A dataclass that is one line of a JSONL file; fields a newer loop added are ignored when read back."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[Record], data: dict[str, Any]) -> Record:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class TurnRecord(JsonRecord):
    """One judged turn of one trajectory (task, sample)."""

    task: str  # Task.key
    level: int | None
    sample: int  # 0-based
    turn: int  # 1-based
    messages: list[dict[str, str]]  # the chat the model saw
    response: str
    code: str | None
    result: dict[str, Any] | None  # EvalResult.to_dict(); None when there was no code
    reward: float
    feedback: str  # what a later turn shows after this turn's answer
    context_turns: list[int]  # 1-based turns the prompt showed
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens
    timings: dict[str, float] = field(default_factory=dict)  # generation_s, evaluation_s
    status: str = FORMAT_ERROR  # the result's status, or format_error

    @property
    def correct(self) -> bool:
        return bool(self.result and self.result.get("correct"))

    @property
    def speedup(self) -> float | None:
        return self.result.get("speedup") if self.result else None

    @property
    def cached(self) -> bool:
        """The verdict of an identical earlier answer, shared by the result cache: this turn was not run again."""
        return bool(self.result and self.result.get("cached"))


@dataclass
class GenerationErrorRecord(JsonRecord):
    """One line of RUN_DIR/generation_errors.jsonl: a model call that failed for good (after retries). Its turn is
    not recorded, so the trajectory ends for this run and `--resume` asks the turn again."""

    task: str  # Task.key
    sample: int  # 0-based
    turn: int  # 1-based: the turn that is still missing
    cause: str
    time: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


def read_trajectories(run_dir: str | Path) -> list[TurnRecord]:
    """Every recorded turn in file order; none when the file is absent. A partial last line (a kill mid-write) is
    skipped; a malformed line elsewhere is an error naming its line number."""
    return _read_rows(Path(run_dir) / TRAJECTORIES, TurnRecord, "a turn record")


def read_generation_errors(run_dir: str | Path) -> list[GenerationErrorRecord]:
    """Every model call of the run that failed for good, in file order (those a resume has since completed too)."""
    return _read_rows(Path(run_dir) / GENERATION_ERRORS, GenerationErrorRecord, "a generation error record")


def read_jsonl_lines(path: Path, what: str = "JSON") -> tuple[list[tuple[int, Any]], int | None]:
    """(1-based line number, value) of each non-empty line of a file that a run appends to, and the number of a
    partial last line that was skipped (a write cut short by a kill, or still under way), else None. Any other line
    that is not JSON is a UsageError naming the file, the line and `what` it should have been."""
    lines = path.read_text().split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            if number == len(lines):  # written without its newline: the write was cut short
                return rows, number
            raise UsageError(f"{path}:{number}: not {what}: {exc}") from exc
    return rows, None


def _read_rows(path: Path, kind: type[Record], what: str) -> list[Record]:
    if not path.exists():
        return []
    records = []
    for number, row in read_jsonl_lines(path, what)[0]:
        try:
            records.append(kind.from_dict(row))
        except (TypeError, AttributeError) as exc:  # JSON, but not an object with the record's fields
            raise UsageError(f"{path}:{number}: not {what}: {exc}") from exc
    return records


class JsonlAppender:
    """Appends objects to a JSONL file, one flushed and synced line each; the file is opened at the first line (a
    run without generation errors gets no generation_errors.jsonl)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: TextIO | None = None

    def append_row(self, row: dict[str, Any]) -> None:
        file = self._open()
        file.write(json.dumps(row, allow_nan=False) + "\n")
        file.flush()
        os.fsync(file.fileno())

    def _open(self) -> TextIO:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _repair_last_line(self.path)
            self._file = self.path.open("a")
        return self._file

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TrajectoryWriter(JsonlAppender):
    """Appends turn records to RUN_DIR/trajectories.jsonl (created at once, so a run's folder always has it)."""

    def __init__(self, run_dir: str | Path) -> None:
        super().__init__(Path(run_dir) / TRAJECTORIES)
        self._open()

    def append(self, record: TurnRecord) -> None:
        self.append_row(record.to_dict())

    def __enter__(self) -> TrajectoryWriter:
        return self


def _repair_last_line(path: Path) -> None:
    """End the file on a newline: a last line a kill cut short is dropped (readers skip it too), a complete one
    that only lacks its newline is kept (readers count it)."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end == len(data):
        return
    try:
        json.loads(data[end:])
    except ValueError:
        with path.open("r+b") as f:
            f.truncate(end)
    else:
        with path.open("ab") as f:
            f.write(b"\n")


def write_json(path: str | Path, data: Any) -> None:
    """Write atomically (temporary file, then rename), so a kill never leaves half a config or summary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def by_trajectory(records: Iterable[TurnRecord]) -> dict[tuple[str, int], list[TurnRecord]]:
    """Records grouped by (task, sample), each group ordered by turn."""
    groups: dict[tuple[str, int], list[TurnRecord]] = {}
    for record in records:
        groups.setdefault((record.task, record.sample), []).append(record)
    return {key: sorted(turns, key=lambda r: r.turn) for key, turns in groups.items()}
