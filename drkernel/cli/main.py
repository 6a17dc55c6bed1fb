"""The `drkernel` command line: the app and its commands, each in its own module (they share drkernel.cli.common
and import neither each other nor this module)."""

from __future__ import annotations

import typer

from drkernel.cli.bench import bench_command, export_sft_command
from drkernel.cli.common import exit_codes
from drkernel.cli.doctor import doctor_command
from drkernel.cli.eval import eval_command, feedback_command
from drkernel.cli.pretrained import pretrained_app
from drkernel.cli.report import report_command
from drkernel.cli.serve import serve_command
from drkernel.cli.synth import synth_command
from drkernel.cli.train import train_command

app = typer.Typer(add_completion=False, no_args_is_help=True, help="KernelGym: evaluate Triton kernels safely.")

for name, command in (("eval", eval_command), ("feedback", feedback_command), ("report", report_command),
                      ("serve", serve_command), ("synth", synth_command), ("bench", bench_command),
                      ("export-sft", export_sft_command), ("train", train_command),
                      ("doctor", doctor_command)):
    app.command(name)(exit_codes(command))

app.add_typer(pretrained_app, name="pretrained")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
