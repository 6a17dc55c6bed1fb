"""`drkernel eval`: one candidate against its reference, or a batch (drkernel.cli.batch); `drkernel feedback`: saved
results as the text a model sees."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from drkernel.cli.common import parse_ids, read_source
from drkernel.errors import UsageError
from drkernel.schema import EvalOptions


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ReferenceMode(str, Enum):
    eager = "eager"
    compile = "compile"


class Precision(str, Enum):
    matched = "matched"
    tolerance = "tolerance"


def eval_command(
    reference: Optional[Path] = typer.Option(None, "--reference", "-r", help="Reference task (.py, KernelBench format)."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", "-c", help="Candidate source defining ModelNew."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Batch: a folder of tasks, a .jsonl/.parquet, or hub:"),
    candidates: Optional[str] = typer.Option(None, "--candidates", help="Batch: a folder of candidates or a .jsonl."),
    level: Optional[list[str]] = typer.Option(None, "--level", help="Batch: only tasks of these levels: 1,2 or 1-3."),
    name: Optional[list[str]] = typer.Option(None, "--name", help="Batch: only tasks with these names (globs)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Batch: write one JSON result per line here."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Parallel workers (default: one per GPU)."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Run on a Ray cluster: its address, or 'auto'."),
    device: Device = typer.Option(Device.auto, "--device", help="auto picks cuda when a GPU is visible."),
    timeout: float = typer.Option(180.0, "--timeout", min=1.0, help="Wall-clock limit per evaluation, seconds."),
    trials: int = typer.Option(5, "--trials", min=1, help="Correctness trials."),
    perf_trials: int = typer.Option(20, "--perf-trials", min=1, help="Timed calls per side."),
    reference_mode: ReferenceMode = typer.Option(ReferenceMode.eager, "--reference-mode"),
    strict: bool = typer.Option(False, "--strict", help="Forbid PyTorch compute around the Triton kernels."),
    precision: Precision = typer.Option(Precision.matched, "--precision", help="matched: a speedup bought with "
                                        "lower precision than the reference's is refused; tolerance: atol/rtol "
                                        "alone, as KernelBench and the paper judge."),
    no_perf: bool = typer.Option(False, "--no-perf", help="Check correctness only."),
    seed: int = typer.Option(42, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object (single evaluation)."),
) -> None:
    """Evaluate one candidate (--reference/--candidate) or a batch (--tasks/--candidates)."""
    options = EvalOptions(
        device=device.value, timeout_s=timeout, correctness_trials=trials, perf_trials=perf_trials,
        reference_mode=reference_mode.value, allow_torch_glue=not strict, measure_performance=not no_perf, seed=seed,
        precision=precision.value,
    )
    single, batch = (reference, candidate), (tasks, candidates)
    if any(single) and any(batch):
        raise UsageError("give either --reference/--candidate or --tasks/--candidates, not both")
    if all(single):
        _eval_single(reference, candidate, options, as_json)  # type: ignore[arg-type]
    elif all(batch):
        from drkernel.cli.batch import run_batch

        levels = parse_ids(level, "--level") if level else None
        run_batch(tasks, candidates, options, levels, name, out, workers, ray)  # type: ignore[arg-type]
    else:
        raise UsageError("need --reference and --candidate, or --tasks and --candidates")


def _eval_single(reference: Path, candidate: Path, options: EvalOptions, as_json: bool) -> None:
    from drkernel.feedback import render
    from drkernel.runner.evaluate import evaluate

    result = evaluate(read_source(reference, "reference"), read_source(candidate, "candidate"), options)
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        print(render(result))


def feedback_command(result_file: Path = typer.Argument(..., help="A JSON result, or a JSONL of results.")) -> None:
    """Render saved results as the compact text a model sees in its next turn."""
    from drkernel.feedback import render

    for line in read_source(result_file, "result file").splitlines():
        if line.strip():
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{result_file}: not JSON: {exc}") from exc
            print(render(data.get("result", data)), end="\n\n")
