"""`drkernel serve`: the HTTP service (FastAPI on uvicorn) over a durable store and a backend.

Imports of the service (FastAPI, uvicorn, the backends) wait until the command runs, so `drkernel eval` neither
pays for them nor needs the `serve` extra.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Optional

import typer

from drkernel.cli.common import err
from drkernel.errors import UsageError

DEFAULT_STORE = Path.home() / ".cache" / "drkernel" / "service.db"


def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; non-loopback needs a token."),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda; auto picks cuda when a GPU is visible."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Parallel workers (default: one per GPU)."),
    store: Path = typer.Option(DEFAULT_STORE, "--store", help="SQLite file of submissions and results."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Evaluate on a Ray cluster: its address, or 'auto'."),
    token_env: str = typer.Option("DRKERNEL_TOKEN", "--token-env",
                                  help="Environment variable holding the bearer token clients must send."),
    retention_days: float = typer.Option(30.0, "--retention-days", min=0.0,
                                         help="Delete finished evaluations older than this; 0 keeps them all."),
) -> None:
    """Serve evaluations over HTTP: /v1/evaluations, KernelGYM's /evaluate, /metrics, /docs."""
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
    from drkernel.cli.batch import _backend

    try:  # before the workers start: a port in use is a usage error, not a failure after a long start
        socket.create_server((host, port)).close()
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc}") from exc
    backend = _backend(device, workers, ray, cache=False)
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
