"""The HTTP service around the evaluator: a durable store, a dispatcher, the FastAPI app and its Python clients.

Modules: `store` (SQLite: submissions, results, the result cache), `dispatcher` (store <-> backend, waiters),
`models` (the typed /v1 bodies), `app` (the FastAPI factory), `kernelgym` (KernelGYM's /evaluate), `client`
(sync and async clients), `dashboard` (the live pages) and `pages` (one evaluation's page, also served for bench
runs by `drkernel report --serve`). The service depends on the core (schema, scheduling, runner), never the reverse.
"""

from typing import Any

MAX_WAIT_S = 60.0  # the longest long-poll the server holds, in seconds (server and clients agree on it)


def viewer(request: Any) -> str | None:
    """The named client asking (set by app.Guard), or None for the operator or an open server: who sees all."""
    return request.scope.get("state", {}).get("client")


def visible(client: str, to: str | None) -> bool:
    """Whether a submission of `client` may be shown to the viewer `to`."""
    return to is None or client == to
