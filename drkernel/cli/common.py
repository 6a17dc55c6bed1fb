"""What the `drkernel` commands share: the stderr console, how drkernel's errors become exit codes, and small
parsers of their arguments. The commands import this module, never each other or `drkernel.cli.main`."""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from drkernel.errors import DrkernelError, UsageError
from drkernel.scheduling.engine import legacy_engine_name

err = Console(stderr=True)

USAGE_EXIT = 2  # bad arguments or input, as click's own usage errors
FAILURE_EXIT = 1  # the evaluation engine or the model failed: not the arguments' fault, not a bug

INTERPRETER_NOTE = "Triton interpreter on the CPU: speedups say nothing of GPU speed"

Command = TypeVar("Command", bound=Callable[..., Any])


def flag(*names: str, help: str) -> Any:
    """A boolean option that is off unless named: shown without a value type (typer shows "<bool>", which reads as
    if it took true or false)."""
    return typer.Option(False, *names, help=help, metavar="")


def say_error(message: str) -> None:
    """The message as plain text (escaped: paths and messages hold brackets, e.g. 'drkernel[serve]')."""
    err.print(f"[red]error:[/red] {escape(message)}")


def exit_codes(command: Command) -> Command:
    """The command, with drkernel's errors as exit codes: a UsageError exits 2 and any other DrkernelError 1, each
    with its message; any other exception is a bug in drkernel and keeps its traceback."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UsageError as exc:
            say_error(str(exc))
            raise typer.Exit(USAGE_EXIT) from None
        except DrkernelError as exc:
            say_error(str(exc))
            raise typer.Exit(FAILURE_EXIT) from None

    return run  # type: ignore[return-value]


def read_source(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the {what} {path}: {exc}") from exc


def parse_ids(texts: list[str], option: str) -> list[int]:
    """'1,2,19' or '1-5,19' (the option may be repeated) as a list of ids (problem ids, levels)."""
    ids: list[int] = []
    text = ",".join(texts)
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        start, dash, end = part.strip().partition("-")
        try:
            ids.extend(range(int(start), int(end) + 1) if dash else [int(start)])
        except ValueError:
            raise UsageError(f"{option} takes numbers like 1,2,19 or 1-5, not {text!r}") from None
    return ids


def engine_settings(settings: dict[str, Any], ray: str | None = None, service: str | None = None) -> dict[str, Any]:
    """The engine's settings given (`--engine`, `--workers`, ...), with the older `--ray ADDRESS` or `--service URL`
    as the engine's name."""
    engine = dict(settings.get("engine", {}))
    older = legacy_engine_name(ray, service)
    if older is not None:
        if "name" in engine:
            raise UsageError("name the engine once: --engine, or the older --ray / --service")
        engine["name"] = older
    return engine


def warn_if_confinement_incomplete(engine_kind: str) -> None:
    """One line on stderr, before anything runs, when evaluations on this machine would miss a confinement layer
    (`drkernel doctor` lists them). Remote engines confine on their own machines."""
    if engine_kind != "embedded":
        return
    from drkernel.runner.confinement import check_layers, missing_warning

    warning = missing_warning(check_layers())
    if warning:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")


def serving_token(host: str, token_env: str, risk: str, named: bool = False) -> str | None:
    """The bearer token in `token_env`; without one (and without named clients) only loopback is served."""
    token = os.environ.get(token_env) or None
    if token is None and not named and not is_loopback(host):
        raise UsageError(f"refusing to serve on {host} without a token: anyone who reaches it could {risk}. "
                         f"Set {token_env} (clients then send 'Authorization: Bearer <token>'), or bind to 127.0.0.1.")
    if token is None and not named:
        err.print(f"[yellow]no token in ${token_env}:[/yellow] serving on loopback ({host}) only, without "
                  "authentication; every local user can reach it.")
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
