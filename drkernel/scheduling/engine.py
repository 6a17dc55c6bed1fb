"""Which evaluation engine judges: one string names it, `EngineConfig` holds it with the settings it takes, and
one parser reads it.

    embedded                 the scheduler in this process (drkernel.scheduling.scheduler), workers on this machine
    ray:auto, ray:HOST:PORT  a Ray cluster: the one this machine belongs to, or the one whose head is at HOST:PORT
    ray://HOST:PORT          a Ray cluster through Ray Client
    http(s)://HOST:PORT      a `drkernel serve` service (its bearer token from $DRKERNEL_TOKEN)

`drkernel eval`, `bench` and `serve` take it as `--engine`, `drkernel train` as `engine.name`. `open_backend` opens
the embedded scheduler or Ray; `drkernel.scheduling.evaluator.open_evaluator` opens any of them as an evaluator. The
older `--ray ADDRESS` and `--service URL` name the same engines through `legacy_engine_name`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from drkernel.errors import UsageError
from drkernel.scheduling.cache import DEFAULT_ENTRIES

if TYPE_CHECKING:
    from drkernel.scheduling.scheduler import Backend

EMBEDDED = "embedded"
SERVICE_SCHEMES = ("http://", "https://")
RAY_CLIENT = "ray://"
RAY_PREFIX = "ray:"


@dataclass(frozen=True)
class EngineConfig:
    """The engine (`name`, parsed by `kind`) and what opening it takes; field metadata is the command line's."""

    name: str = field(default=EMBEDDED, metadata={
        "flag": "--engine",
        "help": "Evaluation engine: embedded (this machine), ray:auto, ray:HOST:PORT or ray://HOST:PORT (a Ray "
                "cluster), or a drkernel serve URL http(s)://HOST:PORT.",
    })
    workers: int | None = field(default=None, metadata={
        "help": "Workers of the embedded engine.", "default_text": "one per GPU; on the CPU, half the cores", "min": 1,
    })
    result_cache: int = field(default=DEFAULT_ENTRIES, metadata={
        "help": "Verdicts of identical answers the embedded engine keeps; 0: off.", "min": 0,
    })
    judge_hosts: bool = field(default=True, metadata={
        "help": "Embedded engine: judges that outlive their evaluations, one per evaluation slot, so an evaluation "
                "starts one process (its subject) instead of two; off: a judge process per evaluation. A service "
                "decides for its own workers (`drkernel serve --no-judge-hosts`); Ray's actors use judge hosts.",
    })
    token_env: str = field(default="DRKERNEL_TOKEN", metadata={
        "help": "The environment variable holding the service's bearer token.",
    })

    def __post_init__(self) -> None:
        self.kind  # noqa: B018  (a name that names no engine is refused here, not when the engine opens)
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"workers must be at least 1, not {self.workers}")
        if self.result_cache < 0:
            raise UsageError(f"result_cache must be >= 0 (0 switches it off), not {self.result_cache}")
        if not self.judge_hosts and self.kind != "embedded":
            raise UsageError(f"turning judge hosts off applies to the embedded engine only, not to {self.name} "
                             "(a service decides for its own workers: drkernel serve --no-judge-hosts)")

    @property
    def kind(self) -> str:
        """"embedded", "ray" or "service"."""
        if self.name == EMBEDDED:
            return "embedded"
        if self.name.startswith(SERVICE_SCHEMES) and len(self.name) > len("https://"):
            return "service"
        if self.name.startswith(RAY_PREFIX) and self.name.removeprefix(RAY_PREFIX).strip("/"):
            return "ray"
        raise UsageError(f"the engine must be embedded, ray:auto, ray:HOST:PORT, ray://HOST:PORT or a service URL "
                         f"http(s)://HOST:PORT, not {self.name!r}")

    @property
    def ray_address(self) -> str:
        """What ray.init takes: "auto", "HOST:PORT" or "ray://HOST:PORT"."""
        return self.name if self.name.startswith(RAY_CLIENT) else self.name.removeprefix(RAY_PREFIX)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EngineConfig:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown engine setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)


def legacy_engine_name(ray: str | None = None, service: str | None = None) -> str | None:
    """The engine named by the older spellings: `--ray ADDRESS` (auto, HOST:PORT or ray://HOST:PORT) and
    `--service URL` (also the `ray` and `service` keys of a bench run's config.json written before `engine`)."""
    if ray and service:
        raise UsageError("name one engine: a Ray cluster or a service, not both")
    if service:
        return service
    if ray:
        return ray if ray.startswith(RAY_CLIENT) else RAY_PREFIX + ray
    return None


def open_backend(engine: EngineConfig, device: str, cache: bool = True) -> Backend:
    """The embedded scheduler or a Ray cluster, evaluating on `device`; `cache=False` for the service, whose store
    is the result cache. A service is not a backend: a UsageError."""
    if engine.kind == "service":
        raise UsageError(f"{engine.name} is a drkernel serve service; here the engine must be embedded or Ray")
    if engine.kind == "ray":
        try:
            from drkernel.scheduling.ray_backend import RayBackend
        except ImportError as exc:
            raise UsageError(str(exc)) from exc
        return RayBackend(address=engine.ray_address, device=device)
    from drkernel.scheduling.scheduler import Scheduler

    return Scheduler(device=device, workers=engine.workers, cache_entries=engine.result_cache if cache else 0,
                     judge_hosts=engine.judge_hosts)
