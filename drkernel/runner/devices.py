"""Which device an evaluation runs on: the GPUs this machine offers, and what `--device auto` means here.

Found without initialising CUDA in the calling process, so a supervisor that starts evaluations never holds a CUDA
context of its own.
"""

from __future__ import annotations

import os
import subprocess

from drkernel.errors import UsageError


def discover_gpus() -> list[str]:
    """GPUs this machine offers, found without initialising CUDA in this process."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"device must be auto, cpu or cuda, not {device!r}")
    if device == "auto":
        return "cuda" if discover_gpus() else "cpu"
    if device == "cuda" and not discover_gpus():
        raise UsageError("--device cuda was asked for, but no GPU is visible (nvidia-smi finds none)")
    return device
