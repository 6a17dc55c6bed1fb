"""The HTTP service around the evaluator: a durable store, a dispatcher, the FastAPI app and its Python clients.

Modules: `store` (SQLite: submissions, results, the result cache), `dispatcher` (store <-> backend, waiters),
`models` (the typed /v1 bodies), `app` (the FastAPI factory), `kernelgym` (KernelGYM's /evaluate), `client`
(sync and async clients). The service depends on the core (schema, scheduling, runner), never the reverse.
"""

MAX_WAIT_S = 60.0  # the longest long-poll the server holds, in seconds (server and clients agree on it)
