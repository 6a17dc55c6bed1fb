"""`drkernel report RUN_DIR ... --out DIR`: tables, figures and a self-contained HTML page of runs; with --serve,
the runs' judged turns browsed in the dashboard's pages instead."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from drkernel.cli.common import err, flag
from drkernel.cli.common import serving_token
from drkernel.errors import UsageError


def report_command(
    run_dirs: Optional[list[Path]] = typer.Argument(None, help="Run folders: bench runs (trajectories.jsonl) or "
                                                              "training runs (metrics.jsonl, validation/step_N/)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Folder to write report.html, report.md, figures/, tables/."),
    published: Optional[list[Path]] = typer.Option(
        None, "--published", help="More published numbers (JSON or YAML, see docs/report.md); repeatable."),
    no_paper: bool = flag("--no-paper", help="Leave out the Dr. Kernel paper's published numbers."),
    pool: Optional[list[str]] = typer.Option(
        None, "--pool", help="NAME=DIR,DIR,...: bench runs of one setting (replicates) reported as one run NAME, "
                             "after the run folders; repeatable."),
    serve: bool = flag("--serve", help="Browse the bench runs' judged turns in a browser (the dashboard's pages) "
                                       "instead of writing a report; needs the serve extra."),
    host: str = typer.Option("127.0.0.1", "--host", help="With --serve: the address to bind; non-loopback needs a "
                                                         "token."),
    port: int = typer.Option(8001, "--port", min=1, max=65535, help="With --serve: the port."),
    token_env: str = typer.Option("DRKERNEL_TOKEN", "--token-env",
                                  help="With --serve: the variable holding the token the browser must give."),
) -> None:
    """Report runs (still going or finished) side by side with published numbers, or browse them (--serve)."""
    if serve:
        return _serve(run_dirs or [], host, port, token_env)
    if out is None:
        raise UsageError("--out is needed to write a report (or --serve to browse the runs)")
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


def _serve(run_dirs: list[Path], host: str, port: int, token_env: str) -> None:
    token = serving_token(host, token_env, "read the runs' code")
    try:
        import uvicorn

        from drkernel.report.browse import create_app
    except ImportError as exc:
        raise UsageError(f"--serve needs the serve extra: pip install 'drkernel[serve]' ({exc})") from exc
    app = create_app(run_dirs, token)
    err.print(f"browse: http://{host}:{port}/dashboard" + ("?token=<token> (once per browser)" if token else ""))
    uvicorn.run(app, host=host, port=port)
