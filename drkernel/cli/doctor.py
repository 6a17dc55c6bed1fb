"""`drkernel doctor`: what confines candidates on this machine, layer by layer, and how to fix a missing one."""

from __future__ import annotations

import json
import os
import sys

import typer

from drkernel.cli.common import flag
from drkernel.runner.confinement import as_json, check_layers


def doctor_command(as_json_output: bool = flag("--json", help="Print the layers as one JSON list.")) -> None:
    """List each confinement layer as active or missing, with what it protects and the fix. Exit code 1 when one
    is missing (evaluations still run, with less confinement)."""
    layers = check_layers()
    if as_json_output:
        sys.stdout.write(json.dumps({"uid": os.geteuid(), "layers": as_json(layers)}) + "\n")
    else:
        print(f"user: uid {os.geteuid()}{' (root)' if os.geteuid() == 0 else ''}")
        for layer in layers:
            print(f"{'active ' if layer.active else 'MISSING'}  {layer.name}: {layer.detail}")
            print(f"         protects: {layer.protects}")
            if layer.fix:
                print(f"         fix: {layer.fix}")
    if not all(layer.active for layer in layers):
        raise typer.Exit(1)
