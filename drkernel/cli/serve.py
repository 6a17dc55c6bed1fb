"""`drkernel serve`: the HTTP service (FastAPI on uvicorn) over a durable store and a backend.

Imports of the service (FastAPI, uvicorn, the backends) wait until the command runs, so `drkernel eval` neither
pays for them nor needs the `serve` extra.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Any, Optional

import typer

from drkernel.cli.common import engine_settings, err, warn_if_confinement_incomplete
from drkernel.cli.options import Fields, config_options
from drkernel.errors import UsageError
from drkernel.scheduling.engine import EngineConfig, open_backend
from drkernel.schema import EvalOptions

DEFAULT_STORE = Path.home() / ".cache" / "drkernel" / "service.db"


@config_options(Fields(EvalOptions, ("device",), "evaluation"), Fields(EngineConfig, ("name", "workers"), "engine"))
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
) -> None:
    """Serve evaluations over HTTP: /v1/evaluations, KernelGYM's /evaluate, /metrics, /docs; the engine is embedded
    or a Ray cluster."""
    engine = EngineConfig.from_dict(engine_settings(settings, ray=ray))
    device = EvalOptions.from_dict(settings.get("evaluation")).device
    if engine.kind == "service":
        raise UsageError(f"serve evaluates on this machine or a Ray cluster: --engine embedded or ray:..., not "
                         f"the service {engine.name}")
    warn_if_confinement_incomplete(engine.kind)
    token = os.environ.get(token_env) or None
    if token is None and not is_loopback(host):
        raise UsageError(f"refusing to serve on {host} without a token: anyone who reaches it could run code here. "
                         f"Set {token_env} (clients then send 'Authorization: Bearer <token>'), or bind to 127.0.0.1.")
    if token is None:
        err.print(f"[yellow]no token in ${token_env}:[/yellow] serving on loopback ({host}) only, without "
                  "authentication; every local user can submit.")
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
    uvicorn.run(create_app(dispatcher, token), host=host, port=port, timeout_graceful_shutdown=5)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
