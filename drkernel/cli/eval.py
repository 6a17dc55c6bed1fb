"""`drkernel eval`: one candidate against its reference, or a batch (drkernel.cli.batch); `drkernel feedback`: saved
results as the text a model sees."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from drkernel.cli.common import engine_settings, flag, parse_ids, read_source, warn_if_confinement_incomplete
from drkernel.cli.options import Fields, config_options
from drkernel.errors import UsageError
from drkernel.scheduling.engine import EngineConfig
from drkernel.schema import EvalOptions


EVAL_OPTIONS = ("device", "timeout_s", "correctness_trials", "perf_trials", "reference_mode", "allow_torch_glue",
                "precision", "measure_performance", "seed")


@config_options(Fields(EvalOptions, EVAL_OPTIONS, "evaluation"),
                Fields(EngineConfig, ("name", "workers", "judge_hosts"), "engine"))
def eval_command(
    settings: dict[str, Any],
    reference: Optional[Path] = typer.Option(None, "--reference", "-r", help="Reference task (.py, KernelBench format)."),
    candidate: Optional[Path] = typer.Option(None, "--candidate", "-c", help="Candidate source defining ModelNew."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Batch: a folder of tasks, a .jsonl/.parquet, or hub:"),
    candidates: Optional[str] = typer.Option(None, "--candidates", help="Batch: a folder of candidates or a .jsonl."),
    level: Optional[list[str]] = typer.Option(None, "--level", help="Batch: only tasks of these levels: 1,2 or 1-3."),
    name: Optional[list[str]] = typer.Option(None, "--name", help="Batch: only tasks with these names (globs)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Batch: write one JSON result per line here."),
    ray: Optional[str] = typer.Option(None, "--ray", hidden=True, help="The older --engine ray:ADDRESS."),
    as_json: bool = flag("--json", help="Print exactly one JSON object (single evaluation)."),
) -> None:
    """Evaluate one candidate (--reference/--candidate) or a batch (--tasks/--candidates)."""
    options = EvalOptions.from_dict(settings.get("evaluation"))
    engine = EngineConfig.from_dict(engine_settings(settings, ray=ray))
    single, batch = (reference, candidate), (tasks, candidates)
    if any(single) and any(batch):
        raise UsageError("give either --reference/--candidate or --tasks/--candidates, not both")
    warn_if_confinement_incomplete(engine.kind)
    if all(single):
        _eval_single(reference, candidate, options, engine, as_json)  # type: ignore[arg-type]
    elif all(batch):
        from drkernel.cli.batch import run_batch

        levels = parse_ids(level, "--level") if level else None
        run_batch(tasks, candidates, options, levels, name, out, engine)  # type: ignore[arg-type]
    else:
        raise UsageError("need --reference and --candidate, or --tasks and --candidates")


def _eval_single(reference: Path, candidate: Path, options: EvalOptions, engine: EngineConfig, as_json: bool) -> None:
    from drkernel.feedback import render
    from drkernel.runner.evaluate import evaluate

    ref_source, cand_source = read_source(reference, "reference"), read_source(candidate, "candidate")
    if engine.kind == "embedded":  # one fresh sandbox here: no workers to start
        result = evaluate(ref_source, cand_source, options)
    else:
        from drkernel.cli.batch import evaluate_all
        from drkernel.tasks import Task

        (result,) = asyncio.run(evaluate_all(engine, options, [(Task(reference.stem, ref_source), cand_source)]))
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
