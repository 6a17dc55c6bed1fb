"""The `drkernel` command line."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from drkernel.schema import EvalOptions, EvalResult

app = typer.Typer(add_completion=False, no_args_is_help=True, help="KernelGym: evaluate Triton kernels safely.")
err = Console(stderr=True)


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


def fail(message: str) -> typer.Exit:
    """Print the message as plain text (escaped: paths and messages hold brackets, e.g. 'drkernel[serve]'); exit 2."""
    err.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(2)


def read_source(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read the {what} {path}: {exc}")


@app.command("eval")
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
        raise fail("give either --reference/--candidate or --tasks/--candidates, not both")
    if all(single):
        _eval_single(reference, candidate, options, as_json)  # type: ignore[arg-type]
    elif all(batch):
        from drkernel.cli.batch import run_batch
        from drkernel.cli.bench import parse_ids

        levels = parse_ids(level, "--level") if level else None
        run_batch(tasks, candidates, options, levels, name, out, workers, ray)  # type: ignore[arg-type]
    else:
        raise fail("need --reference and --candidate, or --tasks and --candidates")


def _eval_single(reference: Path, candidate: Path, options: EvalOptions, as_json: bool) -> None:
    from drkernel.feedback import render
    from drkernel.runner.evaluate import evaluate

    ref_source, cand_source = read_source(reference, "reference"), read_source(candidate, "candidate")
    try:
        result: EvalResult = evaluate(ref_source, cand_source, options)
    except (RuntimeError, ValueError) as exc:
        raise fail(str(exc))
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        print(render(result))


@app.command("feedback")
def feedback_command(result_file: Path = typer.Argument(..., help="A JSON result, or a JSONL of results.")) -> None:
    """Render saved results as the compact text a model sees in its next turn."""
    from drkernel.feedback import render

    for line in read_source(result_file, "result file").splitlines():
        if line.strip():
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise fail(f"{result_file}: not JSON: {exc}")
            print(render(data.get("result", data)), end="\n\n")


from drkernel.cli.report import report_command  # noqa: E402  (after `app`, `err` and `fail`, which they use)
from drkernel.cli.serve import serve_command  # noqa: E402
from drkernel.cli.synth import synth_command  # noqa: E402

app.command("report")(report_command)
app.command("serve")(serve_command)
app.command("synth")(synth_command)

from drkernel.cli.bench import bench_command, export_sft_command  # noqa: E402  (after `app`, `err` and `fail`, which it uses)

app.command("bench")(bench_command)
app.command("export-sft")(export_sft_command)

from drkernel.cli.train import train_command  # noqa: E402  (after `app`, `err` and `fail`, which it uses)

app.command("train")(train_command)

from drkernel.cli.pretrained import pretrained_app  # noqa: E402  (its commands import `fail` from here when they run)

app.add_typer(pretrained_app, name="pretrained")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
