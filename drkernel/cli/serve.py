"""`drkernel serve`: the HTTP service (FastAPI on uvicorn) over a durable store and a backend.

Imports of the service (FastAPI, uvicorn, the backends) wait until the command runs, so `drkernel eval` neither
pays for them nor needs the `serve` extra.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Optional

import typer

from drkernel.cli.common import engine_settings, err, serving_token, warn_if_confinement_incomplete
from drkernel.cli.options import Fields, config_options
from drkernel.errors import UsageError
from drkernel.scheduling.engine import EngineConfig, open_backend
from drkernel.schema import EvalOptions

DEFAULT_STORE = Path.home() / ".cache" / "drkernel" / "service.db"


@config_options(Fields(EvalOptions, ("device",), "evaluation"),
                Fields(EngineConfig, ("name", "workers", "judge_hosts"), "engine"))
def serve_command(
    settings: dict[str, Any],
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; non-loopback needs a token."),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    store: Path = typer.Option(DEFAULT_STORE, "--store", help="SQLite file of submissions and results."),
    ray: Optional[str] = typer.Option(None, "--ray", hidden=True, help="The older --engine ray:ADDRESS."),
    token_env: str = typer.Option("DRKERNEL_TOKEN", "--token-env",
                                  help="Environment variable holding the bearer token clients must send."),
    retention_days: float = typer.Option(30.0, "--retention-days", min=0.0,
                                         help="Delete finished evaluations older than this; 0 keeps them all."),
    clients_file: Optional[Path] = typer.Option(
        None, "--clients-file", help="JSON object of client name -> token: each client sees only its own "
                                     "submissions (the token in --token-env sees them all)."),
) -> None:
    """Serve evaluations over HTTP: /v1/evaluations, KernelGYM's /evaluate, /metrics, /docs, the dashboard at
    /dashboard; the engine is embedded or a Ray cluster."""
    engine = EngineConfig.from_dict(engine_settings(settings, ray=ray))
    device = EvalOptions.from_dict(settings.get("evaluation")).device
    if engine.kind == "service":
        raise UsageError(f"serve evaluates on this machine or a Ray cluster: --engine embedded or ray:..., not "
                         f"the service {engine.name}")
    warn_if_confinement_incomplete(engine.kind)
    clients = read_clients(clients_file) if clients_file else {}
    token = serving_token(host, token_env, "run code here", named=bool(clients))
    try:
        import uvicorn

        from drkernel.service.app import create_app
        from drkernel.service.dispatcher import Dispatcher
        from drkernel.service.store import Store
    except ImportError as exc:
        raise UsageError(f"the service needs its extra: pip install 'drkernel[serve]' ({exc})") from exc
    try:  # before the workers start: a port in use is a usage error, not a failure after a long start
        socket.create_server((host, port)).close()
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc}") from exc
    backend = open_backend(engine, device, cache=False)  # the store is the result cache, under the same key
    dispatcher = Dispatcher(Store(store), backend, backend.device,
                            retention_s=retention_days * 86400 if retention_days > 0 else None)
    err.print(f"store: {store}; device: {backend.device}; workers: {len(backend.workers())}")
    err.print(f"dashboard: http://{host}:{port}/dashboard" + ("?token=<token> (once per browser)" if token or clients
                                                               else ""))
    uvicorn.run(create_app(dispatcher, token, clients), host=host, port=port, timeout_graceful_shutdown=5)


def read_clients(path: Path) -> dict[str, str]:
    """--clients-file: a JSON object of client name -> token, names printable, tokens distinct and 16+ chars."""
    try:
        clients = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--clients-file {path}: {exc}") from exc
    if not isinstance(clients, dict) or not clients:
        raise UsageError(f"--clients-file {path}: expected a JSON object of client name -> token")
    for name, token in clients.items():
        if not name or len(name) > 200 or not name.isprintable():
            raise UsageError(f"--clients-file {path}: client name {name!r} must be 1-200 printable characters")
        if not isinstance(token, str) or len(token) < 16:
            raise UsageError(f"--clients-file {path}: the token of {name!r} must be a string of 16+ characters")
    if len(set(clients.values())) < len(clients):
        raise UsageError(f"--clients-file {path}: two clients share a token")
    return clients
