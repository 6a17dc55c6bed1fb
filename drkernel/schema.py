"""The one result shape and the evaluation options, shared by every layer.

This module imports only the standard library and drkernel.errors (which imports nothing): the sandboxed evaluation
process writes an `EvalResult` as JSON, and the CLI, the scheduler, the HTTP service and the learning signals read
the same shape back.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from drkernel.errors import UsageError


class _StrEnum(str, enum.Enum):
    """An enum whose members are their strings: they print, format and serialise as their values, so JSON holds
    the same strings as before the enums (enum.StrEnum, from Python 3.11 on, does the same)."""

    __str__ = str.__str__
    __format__ = str.__format__


class Status(_StrEnum):
    """Verdict of one evaluation. Only `CORRECT` earns credit."""

    CORRECT = "correct"
    INCORRECT = "incorrect"  # ran, but outputs differ from the reference
    HACKED = "hacked"  # outputs may match, but the candidate cheated (see hack_reasons)
    COMPILE_ERROR = "compile_error"  # syntax error, import failure, Triton compilation failure
    RUNTIME_ERROR = "runtime_error"  # raised while building or running ModelNew
    TIMEOUT = "timeout"  # exceeded the wall-clock limit
    CRASHED = "crashed"  # the evaluation process died (signal, os._exit, memory limit, killed harness)
    INVALID = "invalid"  # the task or the request itself is unusable (no ModelNew, broken reference, ...)


class HackReason(_StrEnum):
    """Why an evaluation was judged a hack (EvalResult.hack_reasons); found by drkernel.sandbox.guards."""

    NO_TRITON_KERNEL = "no_triton_kernel"
    MODE_DEPENDENT = "mode_dependent_kernels"
    TORCH_FALLBACK = "torch_fallback"
    TORCH_COMPUTE = "torch_compute"
    REFERENCE_MODEL = "uses_reference_model"
    DECOY_KERNEL = "decoy_kernel"
    LAZY_KERNEL = "lazy_kernel"
    OUTPUT_CACHING = "output_caching"
    INPUT_MUTATION = "input_mutation"
    PATCHED_HARNESS = "patched_harness"
    GLOBAL_FLAGS = "global_flags_changed"
    FAKE_OUTPUT = "fake_output"
    LOWER_PRECISION = "lower_precision_output"
    OUTPUT_ALIASES_INPUT = "output_aliases_input"
    BACKGROUND_WORK = "background_work"
    SIDE_STREAM = "side_stream_timing"
    EXIT_CALLED = "exit_called"
    IMPOSSIBLE_SPEED = "impossible_speed"
    KILLED_HARNESS = "killed_harness"
    SANDBOX_VIOLATION = "sandbox_violation"
    PRECISION_DOWNCAST = "precision_downcast"
    L2_PERSISTENCE = "l2_persistence"


class ErrorKind(_StrEnum):
    """The error kinds the harness names itself (ErrorInfo.kind); any other kind is the class name of an exception
    raised by the candidate's code or the reference's."""

    MISMATCH = "Mismatch"  # an output differs from the reference's (status incorrect)
    REFERENCE_ERROR = "ReferenceError"  # the reference cannot be loaded, built or given inputs (invalid)
    NO_MODEL_NEW = "NoModelNew"  # the candidate defines no ModelNew (invalid)
    BAD_REQUEST = "BadRequest"  # a request that cannot be read (invalid)
    LIMIT_TOO_LOW = "LimitTooLow"  # a memory limit below what the evaluation's own processes need (invalid)
    TIMEOUT = "Timeout"  # the evaluation ran past its wall-clock limit (timeout)
    MEMORY_LIMIT = "MemoryLimit"  # it ran past its host-memory limit (crashed)
    SIGNAL = "Signal"  # the candidate's process was killed by a signal (crashed)
    EXIT = "Exit"  # a process ended before it answered (crashed)
    BAD_REPLY = "BadReply"  # the candidate's process broke the judge's protocol (crashed)
    KILLED_HARNESS = "KilledHarness"  # the judge or its parent was killed (crashed)
    CORRUPT_RESULT = "CorruptResult"  # the judge reported an unreadable result (crashed)
    # The harness failed, not the candidate: the scheduler runs these again and no cache keeps them.
    SANDBOX_ERROR = "SandboxError"  # the evaluation's processes could not be set up, or the judge's GPU work failed
    WORKER_LOST = "WorkerLost"  # the worker holding the evaluation died, its retries spent
    BACKEND_ERROR = "BackendError"  # the service's evaluation backend raised

    @classmethod
    def of(cls, kind: str) -> ErrorKind | None:
        """The member an ErrorInfo.kind names, or None for an exception's class name."""
        return cls._value2member_map_.get(str(kind))  # type: ignore[return-value]  (a member hashes by its name)


HARNESS_ERRORS = frozenset({ErrorKind.SANDBOX_ERROR, ErrorKind.WORKER_LOST, ErrorKind.BACKEND_ERROR})


@dataclass
class TimingStats:
    """Timing of one side (reference or candidate). Times in milliseconds."""

    median_ms: float
    iqr_ms: float
    mean_ms: float
    min_ms: float
    trials: int
    method: str  # "cuda_event" | "cpu_wall" | "interpreter_wall"
    wall_median_ms: float | None = None  # host-synchronized wall time per call (CUDA only)
    spin_ms: float | None = None  # median device spin before a timed call, outlasting its enqueueing (CUDA only)
    samples_ms: list[float] = field(default_factory=list)  # every timed call, in order: what the statistics are of
    host_ms: list[float] = field(default_factory=list)  # each timed call's host time (CUDA: enqueueing its events)
    # each timed call's [voluntary context switches, involuntary ones, page faults] of the host thread in that time
    host_interruptions: list[list[int]] = field(default_factory=list)
    # each timed call's segments taken from the driver by the caching allocator (cudaMalloc) while it was enqueued
    driver_allocations: list[int] = field(default_factory=list)


@dataclass
class Timing:
    reference: TimingStats | None = None
    candidate: TimingStats | None = None
    reference_mode: str = "eager"  # "eager" | "compile"
    note: str = ""  # e.g. that interpreter timings say nothing of GPU speed
    measurements: int = 1  # 2: the judge measured again (a wall-clock suspicion, or a median that was a slow call)


@dataclass
class Mismatch:
    trial: int
    output: int  # index of the output tensor
    index: list[int]  # multi-index of the first offending element
    expected: float | None
    actual: float | None
    reason: str  # "value" | "shape" | "dtype" | "device" | "type" | "nonfinite" | "rel_error"


@dataclass
class Precision:
    """What precision the candidate's outputs show: errors ||out - exact|| / ||exact|| against a float64 evaluation of
    the reference on the same inputs (one correctness trial, chosen at random), the candidate's and the reference's
    own, and their ratio (the reference's error floored at its dtype's machine epsilon)."""

    rule: str  # "matched" (a ratio above `factor` is refused: precision_downcast) | "tolerance" (reported only)
    candidate_error: float
    reference_error: float
    ratio: float
    factor: float


@dataclass
class Correctness:
    trials: int = 0
    passed_trials: int = 0
    max_abs_diff: float | None = None
    rel_error: float | None = None  # max over trials of ||out - ref|| / ||ref||
    atol: float | None = None
    rtol: float | None = None
    rel_error_bound: float | None = None
    first_mismatch: Mismatch | None = None
    precision: Precision | None = None


@dataclass
class ErrorInfo:
    kind: str  # an ErrorKind's value, or the class name of an exception the candidate's or reference's code raised
    message: str
    traceback: str = ""  # trimmed: the frames of the candidate's own code first

    @property
    def blames_harness(self) -> bool:
        """The harness failed, not the candidate (HARNESS_ERRORS): the verdict says nothing about the kernel."""
        return ErrorKind.of(self.kind) in HARNESS_ERRORS


@dataclass
class KernelTime:
    name: str
    gpu_time_us: float
    calls: int
    own: bool  # one of the candidate's own Triton kernels


@dataclass
class Profile:
    coverage: float | None = None  # own Triton GPU time / all GPU kernel time; None when not measured
    meaningful: bool = False  # False without a GPU: launch counts only
    total_gpu_time_us: float | None = None
    own_gpu_time_us: float | None = None
    kernels: list[KernelTime] = field(default_factory=list)  # top kernels by GPU time
    launches: dict[str, int] = field(default_factory=dict)  # own Triton kernel name -> launch count
    note: str = ""


@dataclass
class Environment:
    device: str = ""  # GPU name or "cpu"
    torch: str = ""
    triton: str = ""
    python: str = ""
    interpreter: bool = False  # Triton ran under TRITON_INTERPRET=1
    gpu: bool = False
    # What the candidate could read, layer by layer (drkernel.sandbox.confine): "pid_namespace", "uid", "landlock"
    # -> how it was applied, or "unavailable: <why>".
    confinement: dict[str, str] = field(default_factory=dict)


@dataclass
class EvalResult:
    status: Status = Status.INVALID
    correct: bool = False  # passed correctness, and no hacking verdict
    hack_reasons: list[str] = field(default_factory=list)  # reason codes, see drkernel.sandbox.guards
    hack_details: dict[str, str] = field(default_factory=dict)  # code -> message a model can learn from
    speedup: float | None = None  # reference median / candidate median
    speedup_ci: list[float] | None = None  # 95% bootstrap interval of the speedup
    timing: Timing | None = None
    correctness: Correctness | None = None
    error: ErrorInfo | None = None
    profile: Profile | None = None
    environment: Environment | None = None
    notes: list[str] = field(default_factory=list)  # e.g. degenerate task, warnings
    duration_s: float | None = None  # wall time of the evaluation, from its start signal to its result
    phases_s: dict[str, float] = field(default_factory=dict)  # where the time went: load, build, correctness, ...
    # On a GPU: the most memory each process's allocator held in each phase that holds the GPU's gate, GiB
    # ("correctness_judge", "correctness_subject", ...): what another evaluation's phase could not have had.
    memory_gib: dict[str, float] = field(default_factory=dict)
    cached: bool = False  # an identical request's verdict, shared (drkernel.scheduling.cache): this one did not run

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a status given as its string (the sandboxed judge's JSON) is the enum

    def to_dict(self) -> dict[str, Any]:
        return _finite(dataclasses.asdict(self))

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        return _build(cls, data)

    @classmethod
    def from_json(cls, text: str) -> EvalResult:
        return cls.from_dict(json.loads(text))

    @classmethod
    def failed(cls, status: Status, kind: str, message: str, traceback: str = "") -> EvalResult:
        """A result that is only its verdict and error: an evaluation that ended before any phase ran."""
        return cls(status=status, error=ErrorInfo(kind=kind, message=message, traceback=traceback))


DEVICES = ("auto", "cpu", "cuda")
REFERENCE_MODES = ("eager", "compile")  # compile: a torch.compile'd reference
PRECISION_RULES = ("matched", "tolerance")


@dataclass
class EvalOptions:
    """How to evaluate one candidate. Every field has a JSON-friendly type so options travel over HTTP."""

    # metadata "help" (and "flag", "choices", "min") is the command line's (drkernel.cli.options)
    device: str = field(default="auto", metadata={
        "choices": DEVICES, "help": "Evaluation device; auto picks cuda when a GPU is visible."})
    timeout_s: float = field(default=180.0, metadata={  # for the whole evaluation, process start included
        "flag": "--timeout", "help": "Wall-clock limit per evaluation, seconds.", "min": 1.0})
    memory_limit_mb: int = 16384  # host memory cap of the evaluation process
    seed: int = field(default=42, metadata={"help": "Seed of the inputs the reference and the candidate run on."})
    correctness_trials: int = field(default=5, metadata={"flag": "--trials", "help": "Correctness trials.", "min": 1})
    perf_trials: int = field(default=20, metadata={"help": "Timed calls per side.", "min": 1})
    warmup_trials: int = 3
    measure_performance: bool = field(default=True, metadata={
        "flag": "--perf/--no-perf", "help": "Time the candidate against the reference; --no-perf checks correctness "
                                            "only."})
    reference_mode: str = field(default="eager", metadata={
        "choices": REFERENCE_MODES, "help": "Time against the eager reference, or against torch.compile's."})
    atol: float | None = None  # overrides the per-dtype default
    rtol: float | None = None
    rel_error_bound: float | None = None  # overrides the per-dtype default of ||out - ref|| / ||ref||
    check_hacks: bool = True
    allow_torch_glue: bool = field(default=True, metadata={
        "flag": "--torch-glue/--strict", "help": "PyTorch ops around the Triton kernels, as KernelBench and the "
                                                 "paper allow; --strict forbids them."})
    min_coverage: float = 0.05  # on a GPU, less of the time than this in the candidate's own kernels is lazy
    profile: bool = True
    # "matched": the candidate's error against float64 may exceed the reference's own by at most `precision_factor`
    # (a speedup bought with TF32, float16 or bfloat16 arithmetic is refused); "tolerance": atol/rtol alone, as
    # KernelBench and the paper judge.
    precision: str = field(default="matched", metadata={
        "choices": PRECISION_RULES, "help": "matched: a speedup bought with lower precision than the reference's is "
                                            "refused; tolerance: atol/rtol alone, as KernelBench and the paper judge."})
    precision_factor: float = 10.0

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise UsageError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.reference_mode not in REFERENCE_MODES:
            raise UsageError(f"reference_mode must be eager or compile, not {self.reference_mode!r}")
        if self.timeout_s <= 0:
            raise UsageError("timeout_s must be positive")
        if self.correctness_trials < 1 or self.perf_trials < 1 or self.warmup_trials < 0:
            raise UsageError("correctness_trials and perf_trials must be >= 1, warmup_trials >= 0")
        if not 0.0 <= self.min_coverage <= 1.0:
            raise UsageError("min_coverage must lie in [0, 1]")
        if self.precision not in PRECISION_RULES:
            raise UsageError(f"precision must be matched or tolerance, not {self.precision!r}")
        if not self.precision_factor >= 1.0:
            raise UsageError("precision_factor must be at least 1")
        if self.memory_limit_mb < 256:
            raise UsageError("memory_limit_mb must be at least 256")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EvalOptions:
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)


@dataclass
class EvalRequest:
    """One unit of work: a reference source, a candidate source and the options."""

    reference: str
    candidate: str
    options: EvalOptions = field(default_factory=EvalOptions)
    task_name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalRequest:
        return cls(
            reference=data["reference"],
            candidate=data["candidate"],
            options=EvalOptions.from_dict(data.get("options")),
            task_name=data.get("task_name", ""),
        )


def _finite(value: Any) -> Any:
    """Plain JSON values: no NaN or infinity (such numbers, a NaN a candidate produced say, become null), and enums
    as their strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _build(cls: type, data: Any) -> Any:
    """Rebuild nested dataclasses from plain dicts (the inverse of dataclasses.asdict)."""
    if data is None:
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _coerce(hints[k], v) for k, v in data.items() if k in fields})  # newer fields are ignored


def _coerce(annotation: Any, value: Any) -> Any:
    if value is None:
        return None
    if dataclasses.is_dataclass(annotation):
        return _build(annotation, value)
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and dataclasses.is_dataclass(args[0]):
        return [_build(args[0], item) for item in value]
    nested = [a for a in args if dataclasses.is_dataclass(a)]  # X | None
    return _build(nested[0], value) if nested else value
