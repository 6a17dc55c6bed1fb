"""Python clients of the HTTP service, sync (`Client`) and async (`AsyncClient`), over httpx.

    with Client("http://127.0.0.1:8000", token=os.environ.get("DRKERNEL_TOKEN")) as client:
        result = client.evaluate(reference_src, candidate_src, {"correctness_trials": 3})

`wait` long-polls: one request per unfinished id, each held by the server until that id is done or `MAX_WAIT_S`
passes, so waiting costs no busy polling. Any HTTP error raises `ServiceError` with the status code and the
server's message.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable

import httpx

from drkernel.errors import EngineError
from drkernel.schema import EvalResult
from drkernel.service import MAX_WAIT_S
TIMEOUT_MARGIN_S = 30.0  # beyond a long-poll's own wait, for the request itself


class ServiceError(EngineError):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code, self.message = status_code, message


def _item(reference: str, candidate: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"reference": reference, "candidate": candidate, "options": options or {}}


def _items(items: Iterable[dict[str, Any] | tuple[str, str] | tuple[str, str, dict[str, Any] | None]]
           ) -> list[dict[str, Any]]:
    """Batch items: request dicts as the API takes them, or (reference, candidate[, options]) tuples."""
    return [item if isinstance(item, dict) else _item(*item) for item in items]


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _json(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        body = response.json()
        message = (body.get("message") or body.get("detail")) if isinstance(body, dict) else body
    except ValueError:
        message = response.text
    raise ServiceError(response.status_code, str(message))


def _poll_wait(deadline: float) -> float:
    """How long the next long-poll may wait: what is left of the deadline, at most MAX_WAIT_S."""
    return max(0.0, min(MAX_WAIT_S, deadline - time.monotonic()))


def _result(body: dict[str, Any]) -> EvalResult | None:
    return None if body["state"] != "done" else EvalResult.from_dict(body["result"])


class Client:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60.0) -> None:
        self._http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout)

    def submit(self, reference: str, candidate: str, options: dict[str, Any] | None = None) -> str:
        return _json(self._http.post("/v1/evaluations", json=_item(reference, candidate, options)))["id"]

    def submit_batch(self, items: Iterable[Any]) -> list[str]:
        return _json(self._http.post("/v1/evaluations", json={"items": _items(items)}))["ids"]

    def get(self, id: str, wait: float | None = None) -> dict[str, Any]:
        """{"id", "state", "result"}; `wait` seconds long-polls for the result (at most MAX_WAIT_S)."""
        params = {"wait": min(wait, MAX_WAIT_S)} if wait else {}
        timeout = (wait or 0) + TIMEOUT_MARGIN_S
        return _json(self._http.get(f"/v1/evaluations/{id}", params=params, timeout=timeout))

    def wait(self, ids: list[str], timeout: float = 3600.0) -> list[EvalResult]:
        """Results in the order of `ids`; TimeoutError when they are not all done within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        results: list[EvalResult] = []
        for id in ids:
            result = _result(self.get(id))
            while result is None and _poll_wait(deadline) > 0:
                result = _result(self.get(id, wait=_poll_wait(deadline)))
            if result is None:
                raise TimeoutError(f"evaluation {id} not done within {timeout:g} s")
            results.append(result)
        return results

    def evaluate(self, reference: str, candidate: str, options: dict[str, Any] | None = None,
                 timeout: float = 3600.0) -> EvalResult:
        return self.wait([self.submit(reference, candidate, options)], timeout)[0]

    def health(self) -> dict[str, Any]:
        return _json(self._http.get("/v1/health"))

    def workers(self) -> list[dict[str, Any]]:
        return _json(self._http.get("/v1/workers"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """`Client`'s methods, async; `wait` long-polls up to `concurrency` ids at once."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 60.0, concurrency: int = 16) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(token), timeout=timeout)
        self._concurrency = concurrency

    async def submit(self, reference: str, candidate: str, options: dict[str, Any] | None = None) -> str:
        return _json(await self._http.post("/v1/evaluations", json=_item(reference, candidate, options)))["id"]

    async def submit_batch(self, items: Iterable[Any]) -> list[str]:
        return _json(await self._http.post("/v1/evaluations", json={"items": _items(items)}))["ids"]

    async def get(self, id: str, wait: float | None = None) -> dict[str, Any]:
        params = {"wait": min(wait, MAX_WAIT_S)} if wait else {}
        timeout = (wait or 0) + TIMEOUT_MARGIN_S
        return _json(await self._http.get(f"/v1/evaluations/{id}", params=params, timeout=timeout))

    async def wait(self, ids: list[str], timeout: float = 3600.0) -> list[EvalResult]:
        deadline = time.monotonic() + timeout
        gate = asyncio.Semaphore(self._concurrency)

        async def one(id: str) -> EvalResult:
            async with gate:
                result = _result(await self.get(id))
                while result is None and _poll_wait(deadline) > 0:
                    result = _result(await self.get(id, wait=_poll_wait(deadline)))
            if result is None:
                raise TimeoutError(f"evaluation {id} not done within {timeout:g} s")
            return result

        return list(await asyncio.gather(*(one(id) for id in ids)))

    async def evaluate(self, reference: str, candidate: str, options: dict[str, Any] | None = None,
                       timeout: float = 3600.0) -> EvalResult:
        return (await self.wait([await self.submit(reference, candidate, options)], timeout))[0]

    async def health(self) -> dict[str, Any]:
        return _json(await self._http.get("/v1/health"))

    async def workers(self) -> list[dict[str, Any]]:
        return _json(await self._http.get("/v1/workers"))

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
