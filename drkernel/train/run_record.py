"""A training run's record (RUN_DIR/run_record.json): the tree's commit, the seed and the whole config, so a result
can be traced to the code and settings that made it. Each start of the run (the first and every resume) adds its
commit and versions: a run resumed on another tree says so. Standard library only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

RUN_RECORD = "run_record.json"
COMMIT_ENV = "DRKERNEL_COMMIT"  # the commit of a copied tree without its .git (set it where the copy is made)
VERSIONED = ("torch", "transformers", "trl", "peft", "triton")


def tree_commit() -> str:
    """`git describe --always --dirty` of the tree drkernel is imported from; DRKERNEL_COMMIT where it is set (a
    copy without .git); "unknown" outside git."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    tree = Path(__file__).resolve().parent.parent.parent
    try:
        described = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True,
                                   text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return described.stdout.strip() if described.returncode == 0 and described.stdout.strip() else "unknown"


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def write_run_record(output_dir: str | Path, kind: str, seed: int, config: dict[str, Any],
                     resumed: bool = False) -> dict[str, Any]:
    """Write (or, on a resume, extend) OUTPUT_DIR/run_record.json: `kind` ("rl" or "sft"), the seed, the config
    and this start's commit, command line, time and package versions; returns the record."""
    path = Path(output_dir) / RUN_RECORD
    record: dict[str, Any] = {"kind": kind, "seed": seed, "config": config, "starts": []}
    if resumed and path.is_file():
        try:
            record["starts"] = json.loads(path.read_text()).get("starts", [])
        except (OSError, ValueError, AttributeError):
            pass
    record["starts"].append({
        "commit": tree_commit(), "resumed": resumed, "argv": sys.argv,
        "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "versions": _versions(),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record
