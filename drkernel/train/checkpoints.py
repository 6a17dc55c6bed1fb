"""A run's checkpoints: which is the newest whole one, which were cut while saving. Standard library only, so that
a script that copies a run to another machine can find the checkpoint a resume will take before anything is
installed."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"  # the Trainer writes it last into a checkpoint: there, the checkpoint is whole


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest whole checkpoint in `output_dir`: one a run stopped while saving it (a time limit's SIGTERM, a
    Ctrl-C) has no readable trainer state, and resuming from it would fail, so the one before it counts."""
    return next((str(path) for path in _checkpoints(Path(output_dir)) if _whole(path)), None)


def cut_checkpoints(output_dir: str | Path) -> list[str]:
    """Checkpoints newer than the last whole one: left by a run stopped while saving (safe to delete)."""
    return [str(path) for path in itertools.takewhile(lambda path: not _whole(path), _checkpoints(Path(output_dir)))]


def _checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir() if path.is_dir() and CHECKPOINT.fullmatch(path.name)]
    return sorted(found, key=checkpoint_step, reverse=True)


def _whole(checkpoint: Path) -> bool:
    try:
        return isinstance(json.loads((checkpoint / TRAINER_STATE).read_text()), dict)
    except (OSError, ValueError):
        return False


def checkpoint_step(checkpoint: str | Path) -> int:
    match = CHECKPOINT.fullmatch(Path(checkpoint).name)
    assert match is not None, checkpoint  # only checkpoints _checkpoints found come here
    return int(match.group(1))
