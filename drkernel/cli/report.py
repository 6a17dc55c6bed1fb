"""`drkernel report RUN_DIR ... --out DIR`: tables, figures and a self-contained HTML page of runs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from drkernel.cli.common import err, flag
from drkernel.errors import UsageError


def report_command(
    run_dirs: Optional[list[Path]] = typer.Argument(None, help="Run folders: bench runs (trajectories.jsonl) or "
                                                              "training runs (metrics.jsonl, validation/step_N/)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write report.html, report.md, figures/, tables/."),
    published: Optional[list[Path]] = typer.Option(
        None, "--published", help="More published numbers (JSON or YAML, see docs/report.md); repeatable."),
    no_paper: bool = flag("--no-paper", help="Leave out the Dr. Kernel paper's published numbers."),
    pool: Optional[list[str]] = typer.Option(
        None, "--pool", help="NAME=DIR,DIR,...: bench runs of one setting (replicates) reported as one run NAME, "
                             "after the run folders; repeatable."),
) -> None:
    """Report runs (still going or finished) side by side with published numbers."""
    from drkernel.report import write_report

    pools = []
    for given in pool or []:
        name, equals, dirs = given.partition("=")
        paths = [Path(d) for d in dirs.split(",") if d.strip()]
        if not equals or not name.strip() or not paths:
            raise UsageError(f"--pool takes NAME=DIR,DIR,..., not {given!r}")
        pools.append((name.strip(), paths))
    try:
        report = write_report(run_dirs or [], out, published or [], paper=not no_paper, pools=pools)
    except OSError as exc:
        raise UsageError(f"cannot write the report under {out}: {exc}") from exc
    for run in report.runs:
        for note in run.notes:
            err.print(escape(f"{run.name}: {note}"))
    for note in report.notes:
        err.print(escape(note))
    print(report.html)
