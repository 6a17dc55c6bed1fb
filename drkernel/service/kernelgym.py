"""KernelGYM compatibility: `POST /evaluate`, `GET /status/{task_id}`, `GET /results/{task_id}`.

Clients written for hkust-nlp's KernelGYM server (for instance Dr. Kernel's reward client, which posts to /evaluate
and then polls /status and /results) work unchanged. Field names and value conventions follow KernelGYM's
`kernelgym/server/api/models.py` and its KernelBench workflow: `status` is "completed" whenever the candidate got a
verdict (even a failing one), "failed" when the harness could not give one, "timeout" when time ran out; failing
results carry `reference_runtime = -1.0` and `speedup = 0.0`; runtimes are in milliseconds. Our full result
(`EvalResult.to_dict()`) travels in `metadata["drkernel"]`.

Only the Triton backend is evaluated; other backends, and entry points other than Model/ModelNew, are refused with
a 422. KernelGYM's other knobs (priority, toolkit, uuid, device, ...) are accepted and ignored; decoy detection
cannot be switched off from here.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any, Literal, Optional

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from drkernel.scheduling.cache import blames_harness
from drkernel.schema import EvalOptions, EvalRequest, EvalResult, Status
from drkernel.service import viewer
from drkernel.service.dispatcher import Dispatcher
from drkernel.service.models import Source
from drkernel.service.store import Record

KernelGymStatus = Literal["pending", "processing", "completed", "failed", "timeout"]
REFERENCE_MODES = {None: "eager", "pytorch": "eager", "eager": "eager", "torch_compile": "compile",
                   "compile": "compile"}  # KernelGYM's reference_backend -> our reference_mode
ERROR_CODES = {  # KernelGYM's ErrorCode values
    Status.INCORRECT: "CORRECTNESS_ERROR",
    Status.HACKED: "CORRECTNESS_ERROR",
    Status.COMPILE_ERROR: "COMPILATION_ERROR",
    Status.RUNTIME_ERROR: "RUNTIME_ERROR",
    Status.TIMEOUT: "RUNTIME_TIMEOUT",
    Status.CRASHED: "RUNTIME_ERROR",
    Status.INVALID: "VALIDATION_ERROR",
}


class KernelGymRequest(BaseModel):
    """KernelGYM's EvaluationRequest: the fields that change an evaluation; any other field is ignored."""

    model_config = ConfigDict(extra="ignore")

    task_id: str = Field(min_length=1, max_length=100)
    reference_code: Source
    kernel_code: Source
    backend: str = "triton"
    entry_point: str = "Model"
    num_correct_trials: int = Field(default=5, ge=1, le=20)
    num_perf_trials: int = Field(default=100, ge=1, le=1000)
    num_warmup: int = Field(default=3, ge=0, le=100)
    timeout: int = Field(default=300, ge=10, le=3600)
    measure_performance: Optional[bool] = None
    run_performance: Optional[bool] = None  # KernelGYM: overrides measure_performance
    enable_profiling: Optional[bool] = None
    reference_backend: Optional[str] = None
    force_refresh: bool = False  # evaluate again even when this task_id already has a result

    @field_validator("backend")
    @classmethod
    def _triton_only(cls, value: str) -> str:
        if value.lower() != "triton":
            raise ValueError(f"backend {value!r} is not evaluated here: this server evaluates Triton kernels only")
        return "triton"

    @field_validator("entry_point")
    @classmethod
    def _model_only(cls, value: str) -> str:
        if value != "Model":
            raise ValueError("entry_point must be 'Model': the reference defines Model, the kernel ModelNew")
        return value

    @field_validator("reference_backend")
    @classmethod
    def _known_reference(cls, value: Optional[str]) -> Optional[str]:
        if value not in REFERENCE_MODES:
            raise ValueError(f"reference_backend must be one of pytorch, torch_compile, not {value!r}")
        return value

    def to_request(self) -> EvalRequest:
        performance = next((v for v in (self.run_performance, self.measure_performance) if v is not None), True)
        options = EvalOptions(
            timeout_s=float(self.timeout),
            correctness_trials=self.num_correct_trials,
            perf_trials=self.num_perf_trials,
            warmup_trials=self.num_warmup,
            measure_performance=performance,
            profile=True if self.enable_profiling is None else self.enable_profiling,
            reference_mode=REFERENCE_MODES[self.reference_backend],
        )
        return EvalRequest(self.reference_code, self.kernel_code, options, task_name=self.task_id)


class KernelGymResponse(BaseModel):
    """KernelGYM's EvaluationResponse."""

    task_id: str
    status: KernelGymStatus
    compiled: Optional[bool] = None
    correctness: Optional[bool] = None
    decoy_kernel: Optional[bool] = None
    reference_runtime: Optional[float] = None
    kernel_runtime: Optional[float] = None
    speedup: Optional[float] = None
    metadata: Optional[dict[str, Any]] = None
    error_message: Optional[str] = None
    error_code: Optional[str] = None
    submitted_at: Optional[str] = None
    completed_at: Optional[str] = None
    processing_time: Optional[float] = None


class KernelGymStatusResponse(BaseModel):
    task_id: str
    status: KernelGymStatus


def router(dispatcher: Dispatcher) -> APIRouter:
    api = APIRouter(tags=["KernelGYM compatibility"])

    @api.post("/evaluate", response_model=KernelGymResponse)
    async def evaluate(body: KernelGymRequest, http: Request) -> KernelGymResponse:
        """Evaluate and answer once the verdict is in; a known task_id answers its earlier evaluation."""
        name = alias(http, body.task_id)
        id = None if body.force_refresh else await asyncio.to_thread(dispatcher.store.resolve, name)
        if id is None:
            (id,) = await asyncio.to_thread(dispatcher.submit, [body.to_request()], viewer(http) or "")
            await asyncio.to_thread(dispatcher.store.alias, name, id)
        record = await dispatcher.wait(id, timeout=None)
        assert record is not None
        return response(body.task_id, record)

    @api.get("/status/{task_id}", response_model=KernelGymStatusResponse)
    async def status(task_id: str, http: Request) -> KernelGymStatusResponse:
        record = await _record(dispatcher, alias(http, task_id), task_id)
        return KernelGymStatusResponse(task_id=task_id, status=response(task_id, record).status)

    @api.get("/results/{task_id}", response_model=KernelGymResponse)
    async def results(task_id: str, http: Request) -> KernelGymResponse:
        record = await _record(dispatcher, alias(http, task_id), task_id)
        if record.state != "done":
            raise HTTPException(404, f"task {task_id} has no result yet")
        return response(task_id, record)

    return api


def response(task_id: str, record: Record) -> KernelGymResponse:
    """Translate one stored row into KernelGYM's response (a row still waiting: pending or processing)."""
    if record.result is None:
        return KernelGymResponse(task_id=task_id, status="pending" if record.state == "queued" else "processing",
                                 submitted_at=_iso(record.submitted_at))
    result = EvalResult.from_dict(record.result)
    timing = result.timing
    reference_ms = timing.reference.median_ms if timing and timing.reference else None
    kernel_ms = timing.candidate.median_ms if timing and timing.candidate else None
    return KernelGymResponse(
        task_id=task_id,
        status=_status(result),
        compiled=result.status not in (Status.COMPILE_ERROR, Status.INVALID) and not _failed(result),
        correctness=result.correct,
        decoy_kernel=result.status == Status.HACKED,
        reference_runtime=reference_ms if result.correct and reference_ms is not None else -1.0,
        kernel_runtime=kernel_ms if kernel_ms is not None else -1.0,
        speedup=result.speedup if result.correct and result.speedup is not None else 0.0,
        metadata={
            "evaluation_id": record.id,
            "backend": "triton",
            "device": result.environment.device if result.environment else None,
            "hack_reasons": result.hack_reasons,
            "cached": record.cached,
            "drkernel": record.result,
        },
        error_message=_message(result),
        error_code=ERROR_CODES.get(result.status) if not _failed(result) else "SYSTEM_ERROR",
        submitted_at=_iso(record.submitted_at),
        completed_at=_iso(record.finished_at),
        processing_time=result.duration_s,
    )


def _status(result: EvalResult) -> KernelGymStatus:
    if _failed(result):
        return "failed"
    return "timeout" if result.status == Status.TIMEOUT else "completed"


def _failed(result: EvalResult) -> bool:
    """KernelGYM's "failed": no verdict on the kernel (harness failure, or a request it rejects as invalid)."""
    return blames_harness(result) or result.status == Status.INVALID


def _message(result: EvalResult) -> str | None:
    if result.error is not None:
        return f"{result.error.kind}: {result.error.message}"
    if result.hack_details:
        return "; ".join(result.hack_details.values())
    return None


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def alias(http: Request, task_id: str) -> str:
    """The stored name of a client's task_id: each named client has its own task ids (the operator's are bare)."""
    client = viewer(http) or ""
    return f"{client}\x1f{task_id}" if client else task_id


async def _record(dispatcher: Dispatcher, name: str, task_id: str) -> Record:
    id = await asyncio.to_thread(dispatcher.store.resolve, name)
    record = None if id is None else await asyncio.to_thread(dispatcher.store.get, id)
    if record is None:
        raise HTTPException(404, f"task {task_id} not found")
    return record

