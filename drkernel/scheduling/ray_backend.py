"""Evaluate on a Ray cluster: one long-lived actor per GPU (or per `num_cpus_per_eval` CPUs), a queue in front.

Why actors, not tasks: an evaluation forks from a warm fork server that has already imported torch and Triton
(seconds of start-up), and reuses the Triton cache of its GPU. A Ray task would pay that start-up per evaluation;
an actor pays it once and owns its GPU for its lifetime, which also keeps timings clean (one evaluation per GPU).

Each actor runs `drkernel.runner.supervisor.Supervisor`, which already turns every candidate failure (raise, exit,
segfault, hang, memory) into a result: an actor method raises only when the actor itself is lost (its node died,
its process was killed). Those are the failures Ray retries: `max_restarts` brings the actor back, and
`max_task_retries` reruns the evaluation it held. When the retries are spent, the evaluation ends as an
infrastructure failure (status crashed, error kind WorkerLost), never as the candidate's fault.

The queue lives in this process: each actor gets at most `JOBS_PER_ACTOR` evaluations at once, and the next one is
sent when one comes back, so a slow GPU never hoards work that an idle one could do. Inside the actor (a threaded
actor, one thread per held evaluation) each evaluation's process is forked and initialised as soon as it arrives,
while the one in front runs, as the embedded scheduler's workers do; one thread runs them on the device in turn.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from drkernel.errors import EngineError, UsageError
from drkernel.runner.supervisor import DeviceQueue, Supervisor, memory_share_mb
from drkernel.scheduling.scheduler import JOBS_PER_WORKER
from drkernel.schema import ErrorInfo, ErrorKind, EvalRequest, EvalResult, Status

try:
    import ray
except ImportError as exc:  # optional dependency
    raise ImportError("the Ray backend needs Ray: pip install 'drkernel[ray]'") from exc

JOBS_PER_ACTOR = JOBS_PER_WORKER  # the running evaluation and the next ones, starting up meanwhile
MAX_RESTARTS = 3  # an actor whose process or node dies comes back this many times
MAX_TASK_RETRIES = 3  # and the evaluation it held runs again, this many times
ACTOR_START_TIMEOUT_S = 300.0  # for the cluster to place and start every actor


class EvaluationActor:
    """Owns one device slot on one node: a warm Supervisor, fed one evaluation at a time."""

    def __init__(self, device: str, resource: str, per_actor: float) -> None:
        self.device = device
        # Ray sets CUDA_VISIBLE_DEVICES to the GPU it gave this actor; the supervisor's fork server sets
        # CUDA_VISIBLE_DEVICES to `gpu` itself, so it needs that value as given (a physical index or UUID), not the
        # index "0" seen here.
        self.gpu = _assigned_gpu() if device == "cuda" else None
        share = _actors_on_node(resource, per_actor)
        # Up to JOBS_PER_ACTOR evaluation processes are alive at once: they share the actor's share of memory.
        supervisor = Supervisor(device=device, gpu=self.gpu, memory_cap_mb=memory_share_mb(share * JOBS_PER_ACTOR))
        self.device_queue = DeviceQueue(supervisor)

    def run(self, request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The result, and where it ran: a new pid tells the driver that Ray restarted this actor.

        Ray runs up to JOBS_PER_ACTOR of these calls at once (a threaded actor): each forks its evaluation on
        arrival, and the device queue runs them in turn. A harness fault raises here: the driver reports it.
        """
        return self.device_queue.submit(EvalRequest.from_dict(request)).result().to_dict(), self.info()

    def info(self) -> dict[str, Any]:
        return {"device": self.device, "gpu": self.gpu, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id()}


def _assigned_gpu() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return visible.split(",")[0] if visible else str(ray.get_gpu_ids()[0])


def _actors_on_node(resource: str, per_actor: float) -> float:
    """How many actors like this one the node holds: they share its memory."""
    node = ray.get_runtime_context().get_node_id()
    resources = next(n["Resources"] for n in ray.nodes() if n["NodeID"] == node)
    return max(1.0, resources.get(resource, 1.0) // per_actor)


@dataclass
class _Actor:
    name: str
    handle: Any
    info: dict[str, Any] = field(default_factory=dict)  # as last reported: device, gpu, pid, node
    inflight: int = 0
    completed: int = 0
    restarts: int = 0

    def seen(self, info: dict[str, Any]) -> None:
        """A different pid than before means Ray restarted the actor."""
        self.restarts += bool(self.info) and info["pid"] != self.info["pid"]
        self.info = info


@dataclass(eq=False)  # jobs are compared (and hashed) by identity
class _Job:
    request: EvalRequest
    future: Future[EvalResult] = field(default_factory=Future)


class RayBackend:
    """The `Backend` protocol on Ray: `submit -> Future[EvalResult]`, `workers()`, `close()`."""

    def __init__(self, address: str | None = "auto", device: str = "auto", num_cpus_per_eval: float = 1) -> None:
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            try:
                ray.init(address=address, log_to_driver=False, include_dashboard=False)
            except ConnectionError as exc:
                raise EngineError(f"cannot reach the Ray cluster at {address!r}: {exc}") from exc
        resources = ray.cluster_resources()
        self.device = _resolve(device, resources)
        if self.device == "cuda":
            resource, per_actor, options = "GPU", 1.0, {"num_gpus": 1, "num_cpus": num_cpus_per_eval}
        else:
            resource, per_actor, options = "CPU", num_cpus_per_eval, {"num_cpus": num_cpus_per_eval}
        count = int(resources.get(resource, 0) // per_actor)
        if count < 1:
            raise EngineError(f"the Ray cluster has no room for one evaluation ({options}): {resources}")
        remote = ray.remote(EvaluationActor).options(
            max_restarts=MAX_RESTARTS, max_task_retries=MAX_TASK_RETRIES, max_concurrency=JOBS_PER_ACTOR, **options
        )
        self._actors = [
            _Actor(f"ray-{self.device}{i}", remote.remote(self.device, resource, per_actor)) for i in range(count)
        ]
        try:
            infos = ray.get([a.handle.info.remote() for a in self._actors], timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as exc:
            for actor in self._actors:
                ray.kill(actor.handle)
            raise EngineError(f"the Ray cluster did not start {count} evaluation actors ({options}) within "
                               f"{ACTOR_START_TIMEOUT_S:g} s") from exc
        for actor, info in zip(self._actors, infos):
            actor.seen(info)
        self._queue: collections.deque[_Job] = collections.deque()
        self._inflight: set[_Job] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, request: EvalRequest) -> Future[EvalResult]:
        job = _Job(request)
        with self._lock:
            if self._closed:
                raise RuntimeError("the Ray backend is closed")
            self._queue.append(job)
            self._feed()
        return job.future

    def workers(self) -> list[dict[str, object]]:
        """What this process knows (no remote call: an actor answers only between evaluations)."""
        with self._lock:
            return [
                {"name": a.name, **a.info, "busy": a.inflight > 0, "inflight": a.inflight,
                 "completed": a.completed, "restarts": a.restarts}
                for a in self._actors
            ]

    @property
    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    def close(self) -> None:
        """Cancel what has not finished (a service resumes it after a restart) and let the actors go."""
        with self._lock:
            self._closed = True
            unfinished = [*self._queue, *self._inflight]
            self._queue.clear()
        for job in unfinished:
            job.future.cancel()
        for actor in self._actors:
            ray.kill(actor.handle)
        if self._owns_ray:
            ray.shutdown()

    # Internals --------------------------------------------------------------------------------------------

    def _feed(self) -> None:
        """Send queued jobs to actors with room (least loaded first); called with the lock held."""
        while self._queue and not self._closed:
            actor = min(self._actors, key=lambda a: a.inflight)
            if actor.inflight >= JOBS_PER_ACTOR:
                return
            job = self._queue.popleft()
            if job.future.cancelled():
                continue
            actor.inflight += 1
            self._inflight.add(job)
            ref = actor.handle.run.remote(job.request.to_dict())
            ref.future().add_done_callback(lambda f, a=actor, j=job: self._done(a, j, f))

    def _done(self, actor: _Actor, job: _Job, outcome: Future[tuple[dict[str, Any], int]]) -> None:
        error = outcome.exception()
        with self._lock:
            actor.inflight -= 1
            self._inflight.discard(job)
            if error is None:
                actor.seen(outcome.result()[1])
                actor.completed += 1
            self._feed()
        with contextlib.suppress(InvalidStateError):  # cancelled by close() meanwhile
            job.future.set_result(EvalResult.from_dict(outcome.result()[0]) if error is None else _harness_failed(error))


def _resolve(device: str, resources: dict[str, float]) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"device must be auto, cpu or cuda, not {device!r}")
    gpus = resources.get("GPU", 0) >= 1
    if device == "cuda" and not gpus:
        raise UsageError("device cuda was asked for, but the Ray cluster offers no GPU")
    return device if device != "auto" else ("cuda" if gpus else "cpu")


def _harness_failed(error: BaseException) -> EvalResult:
    """An evaluation the actor could not finish: the actor was lost for good, or the harness in it raised."""
    if isinstance(error, ray.exceptions.RayActorError):
        kind, message = ErrorKind.WORKER_LOST, f"the Ray actor was lost and Ray's retries are spent: {error!r}"
    else:
        kind, message = ErrorKind.SANDBOX_ERROR, f"the evaluation actor failed: {error!r}"
    return EvalResult(status=Status.CRASHED, error=ErrorInfo(kind=kind, message=message))
