"""One evaluation, start to verdict, inside the sandboxed process.

Order of work: load the reference, snapshot the harness's state, load the candidate, build both models from the
same seeds, run correctness trials (candidate first, on its own copy of fresh inputs, across training/eval and
autograd modes), time both sides interleaved, profile, ablate the candidate's kernels, and decide.
"""

from __future__ import annotations

import os
import platform
import random
import secrets
import statistics
import sys
import time
import traceback
import types
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import triton

from drkernel.sandbox import audit, correctness, guards, launches, loading, profiling, static_checks, timing
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.correctness import PRECISION_RANK
from drkernel.sandbox.guards import Findings
from drkernel.schema import (
    Correctness,
    Environment,
    ErrorInfo,
    EvalOptions,
    EvalRequest,
    EvalResult,
    Profile,
    Status,
    Timing,
)

# (label, training, autograd context): every candidate must run its own Triton kernels in each.
MODES: list[tuple[str, bool, Callable[[], Any]]] = [
    ("train+grad", True, torch.enable_grad),
    ("eval+no_grad", False, torch.no_grad),
    ("train+no_grad", True, torch.no_grad),
    ("eval+inference_mode", False, torch.inference_mode),
    ("eval+grad", False, torch.enable_grad),
]
CHECKED_TIMING_TRIALS = 1  # timed calls, chosen at random, whose outputs are compared in full (all: on a sample)
TIMED_SAMPLE_ELEMENTS = 4096  # elements per output compared after every other timed call
SHARE_OF_MEMORY = 0.25  # of the GPU's memory, at most, for one evaluation's trials beside others' (3 at once)
DEGENERACY_SAMPLE = 1 << 20  # elements of the reference's output kept to judge whether the task is degenerate
TRACEBACK_CHARS = 4000


class Failure(Exception):
    """Ends the evaluation with a verdict other than correct."""

    def __init__(self, status: Status, kind: str, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.tb = status, kind, message, tb


@dataclass
class Evaluation:
    request: EvalRequest
    workdir: Path
    device: torch.device
    findings: Findings = field(default_factory=Findings)
    notes: list[str] = field(default_factory=list)
    recorder: launches.LaunchRecorder = field(default_factory=launches.LaunchRecorder)
    own_names: set[str] = field(default_factory=set)  # names of the candidate's own kernels seen launching
    own_counts: Counter[str] = field(default_factory=Counter)  # launches per own kernel, correctness trials
    first_trial_s: float = 0.0  # the first correctness trial, where the candidate's kernels compile
    gate: DeviceGate | None = None  # shared with other evaluations on this GPU; None when it runs alone
    alone: bool = False  # its inputs are too large to share the GPU's memory: every GPU phase takes it exclusively

    @property
    def options(self) -> EvalOptions:
        return self.request.options

    # -- set-up ----------------------------------------------------------------------------------------------

    def load_reference(self) -> None:
        """Load and build the reference before any candidate code exists in the process."""
        ref_path = self.workdir / "reference.py"
        try:
            self.ref_module = loading.load_module(self.request.reference, ref_path, f"drkernel_reference_{os.getpid()}")
            loading.require(self.ref_module, ("Model", "get_inputs", "get_init_inputs"), "reference")
            # The harness's own handles, taken before any candidate code runs.
            self.ref_class = self.ref_module.Model
            self.get_inputs = self.ref_module.get_inputs
            self.get_init_inputs = self.ref_module.get_init_inputs
            self.init_inputs = self._seeded(self.options.seed, self.get_init_inputs)
            self.ref_model = self._seeded(self.options.seed, lambda: self.ref_class(*self.init_inputs))
            self.ref_model = self.ref_model.to(self.device)
        except Failure:
            raise
        except BaseException as exc:
            raise Failure(Status.INVALID, "ReferenceError", f"the reference is unusable: {exc}", self._tb(exc))
        if self.options.reference_mode == "compile":
            self.ref_call: Callable[..., Any] = torch.compile(self.ref_model)
        else:
            self.ref_call = self.ref_model

    def load_candidate(self) -> None:
        self.tripwire = guards.ReferenceTripwire(self.ref_class)
        self.hints = static_checks.inspect_source(self.request.candidate)
        self.notes += [f"static: {n}" for n in self.hints.notes()]
        harness = [m for name, m in sys.modules.items() if name.startswith("drkernel.")] + [self.ref_module]
        self.cand_path = self.workdir / "candidate.py"
        self.recorder.own_files = {str(self.cand_path)}
        self.recorder.install()
        self.thread_origins = guards.ThreadOrigins(str(self.cand_path))
        self.state_guard = guards.StateGuard(harness, classes={type(m) for m in self.ref_model.modules()})
        _AUDIT.on_violation = self._sandbox_violation
        _AUDIT.candidate_file = str(self.cand_path)
        if _interpreting():
            _autotune_by_wall_clock()
        _hide_from_candidate(self.ref_module.__name__)
        with self._candidate_running():
            try:
                self.cand_module = loading.load_module(
                    self.request.candidate, self.cand_path, f"drkernel_candidate_{os.getpid()}"
                )
            except loading.SourceLoadError as exc:
                raise self._classify(exc.__cause__ or exc)
        self.state_guard.check(self.findings)
        if not hasattr(self.cand_module, "ModelNew"):
            raise Failure(Status.INVALID, "NoModelNew", "the candidate defines no class ModelNew")

    def build_candidate(self) -> None:
        with self._candidate_running():
            try:
                model = self._seeded(self.options.seed, lambda: self.cand_module.ModelNew(*self.init_inputs))
                self.cand_model = model.to(self.device) if isinstance(model, torch.nn.Module) else model
            except BaseException as exc:
                raise self._classify(exc)
        if any(isinstance(m, self.ref_class) for m in _submodules(self.cand_model)):
            self.findings.add(
                guards.REFERENCE_MODEL,
                "ModelNew is or contains the reference Model; write the computation as Triton kernels instead.",
            )
        self._check_tripwire()

    def _check_tripwire(self) -> None:
        if self.tripwire.calls:
            self.findings.add(
                guards.REFERENCE_MODEL,
                "the candidate constructed or called the reference Model; the computation must be its own.",
            )

    def _sandbox_violation(self, event: str) -> None:
        self.findings.add(
            guards.SANDBOX_VIOLATION,
            f"the candidate called {event}: introspecting the harness (frames, gc), writing files, ctypes, "
            "signals, processes and sockets are not allowed in a kernel.",
        )

    # -- correctness -----------------------------------------------------------------------------------------

    def check_correctness(self) -> Correctness:
        opts = self.options
        trials = max(opts.correctness_trials, len(MODES) if opts.check_hacks else 0)
        summary = Correctness(trials=trials)
        self.launches_by_mode: dict[str, int] = {}
        ref_samples: list[torch.Tensor] = []
        started = time.perf_counter()
        for trial in range(trials):
            with self.sharing_gpu():
                self._correctness_trial(trial, summary, ref_samples)
            if trial == 0:
                self.first_trial_s = time.perf_counter() - started
        self._check_modes()
        self._note_degenerate(ref_samples)
        self.correctness = summary
        return summary

    def _correctness_trial(self, trial: int, summary: Correctness, ref_samples: list[torch.Tensor]) -> None:
        opts = self.options
        label, training, grad_mode = MODES[trial % len(MODES)]
        inputs = self._inputs(opts.seed + 1000 + trial)
        cand_inputs = _clone(inputs)
        self._set_training(training)
        with grad_mode():
            cand_out = self._call_candidate(cand_inputs, pristine=inputs, label=label)
            self._sync()
            ref_out = self.ref_call(*inputs)  # the pristine copy: the mutation check is done with it
            self._sync()
        self._check_outputs(inputs, cand_inputs, ref_out, cand_out)
        comparison = correctness.compare(ref_out, cand_out, trial, opts.atol, opts.rtol, opts.rel_error_bound)
        if comparison.tolerance is not None:
            summary.atol, summary.rtol = comparison.tolerance.atol, comparison.tolerance.rtol
            summary.rel_error_bound = comparison.tolerance.rel_error_bound
        summary.max_abs_diff = max(summary.max_abs_diff or 0.0, comparison.max_abs_diff)
        summary.rel_error = max(summary.rel_error or 0.0, comparison.rel_error)
        first_ref = correctness.flatten_outputs(ref_out)[0]
        if isinstance(first_ref, torch.Tensor) and len(ref_samples) < 2:
            ref_samples.append(first_ref.detach().reshape(-1)[:DEGENERACY_SAMPLE].clone())
        # Freed memory must not hold answers a later allocation could find.
        guards.poison(correctness.flatten_outputs(cand_out) + correctness.flatten_outputs(ref_out) + cand_inputs)
        if not comparison.ok:
            summary.first_mismatch = comparison.mismatch
            self._note_dtype_cheat(ref_out, cand_out)
            self.correctness = summary
            raise Failure(Status.INCORRECT, "Mismatch", f"trial {trial} ({label}): {comparison.message}")
        summary.passed_trials += 1

    def _call_candidate(self, args: list[Any], pristine: list[Any] | None = None, label: str = "") -> Any:
        """Run the candidate's forward with every runtime check around it."""
        threads_before, started_before = self.thread_origins.alive(), self.thread_origins.started
        children_before = guards.child_processes()
        self.recorder.take()
        strict = not self.options.allow_torch_glue
        ops = guards.TorchOpRecorder() if strict else nullcontext()
        with self._candidate_running(), ops:
            try:
                out = self.cand_model(*args)
            except BaseException as exc:
                raise self._classify(exc)
        failed = self.recorder.failed_launches()
        recorded = self.recorder.take()
        if failed:
            self.findings.add(
                guards.TORCH_FALLBACK,
                f"A Triton kernel ({failed[0]}) failed and forward still returned: the candidate caught the error "
                "and fell back to other code. Fix the kernel instead of catching its failure.",
            )
        own = [launch for launch in recorded if launch.own]
        if label:
            self.launches_by_mode[label] = self.launches_by_mode.get(label, 0) + len(own)
            self.own_names |= {launch.name for launch in own}
            self.own_counts.update(launch.name for launch in own)
        if strict and ops.compute_ops():  # type: ignore[union-attr]
            used = ", ".join(f"{op} x{n}" for op, n in sorted(ops.compute_ops().items()))  # type: ignore[union-attr]
            self.findings.add(
                guards.TORCH_COMPUTE,
                f"forward computes with PyTorch operators ({used}); this evaluation allows no PyTorch compute "
                "around the Triton kernels.",
            )
        if pristine is not None:
            changed = guards.mutated_inputs(pristine, args)
            if changed:
                self.findings.add(
                    guards.INPUT_MUTATION,
                    f"forward changed its input(s) {changed} in place; inputs must be left as they are.",
                )
        # Threads the candidate started during forward (finished or not), or that are still running from before.
        threads = sorted(set(self.thread_origins.alive()) | set(threads_before))
        started = self.thread_origins.started - started_before
        new_children = guards.child_processes() - children_before
        if threads or started or new_children:
            self.findings.add(
                guards.BACKGROUND_WORK,
                f"forward worked outside its own thread (threads started: {started}, running: {threads or 'none'}, "
                f"processes: {sorted(new_children) or 'none'}): all work must be done, on the GPU's current "
                "stream, before forward returns.",
            )
        self._check_tripwire()
        self.state_guard.check(self.findings)
        return out

    def _check_outputs(self, inputs: list[Any], cand_inputs: list[Any], ref_out: Any, cand_out: Any) -> None:
        cand_list = correctness.flatten_outputs(cand_out)
        fakes = guards.fake_outputs(cand_list)
        if fakes:
            self.findings.add(guards.FAKE_OUTPUT, f"{'; '.join(fakes)}: outputs must be plain torch.Tensor objects.")
        ref_aliases = guards.storages(correctness.flatten_outputs(ref_out)) & guards.storages(inputs)
        cand_aliases = guards.storages(cand_list) & guards.storages(cand_inputs)
        if cand_aliases and not ref_aliases:
            self.findings.add(
                guards.OUTPUT_ALIASES_INPUT,
                "an output shares memory with an input; the reference returns new tensors.",
            )

    def _note_dtype_cheat(self, ref_out: Any, cand_out: Any) -> None:
        for ref, cand in zip(correctness.flatten_outputs(ref_out), correctness.flatten_outputs(cand_out)):
            if isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor):
                if PRECISION_RANK.get(cand.dtype, 9) < PRECISION_RANK.get(ref.dtype, 0):
                    self.findings.add(
                        guards.LOWER_PRECISION,
                        f"an output is {cand.dtype} where the reference gives {ref.dtype}: computing in lower "
                        "precision is not the same function.",
                    )

    def _check_modes(self) -> None:
        if not self.options.check_hacks:
            return
        total = sum(self.launches_by_mode.values())
        if total == 0:
            self.findings.add(
                guards.NO_TRITON_KERNEL,
                "ModelNew ran no Triton kernel of its own: the work was done by PyTorch or another library. "
                "Implement the computation in @triton.jit kernels launched from forward.",
            )
            return
        missing = [label for label, n in self.launches_by_mode.items() if n == 0]
        if missing:
            self.findings.add(
                guards.MODE_DEPENDENT,
                f"ModelNew ran no Triton kernel in mode(s) {', '.join(missing)}: kernels must run whatever the "
                "training flag, autograd or inference mode.",
            )

    def _note_degenerate(self, samples: list[torch.Tensor]) -> None:
        if len(samples) == 2:
            why = correctness.degeneracy(*samples)
            if why:
                self.notes.append(f"degenerate_task: {why}")

    # -- timing, profiling, ablation -------------------------------------------------------------------------

    def measure(self) -> tuple[Timing, float, list[float]]:
        opts = self.options
        self._set_training(False)
        buffers = self._inputs(self.options.seed + 3000)  # every timed call reads these, refilled before each
        warmup = max(1, opts.warmup_trials)  # at least one: its host time sets the timer's launch cover
        rng = random.Random(secrets.randbits(64))  # which trials get a full comparison is not predictable
        checked = set(rng.sample(range(opts.perf_trials), min(CHECKED_TIMING_TRIALS, opts.perf_trials)))
        own_per_call: list[int] = []

        def fresh_args() -> list[Any]:
            """New values from get_inputs under an unpredictable seed (dtypes and ranges, indices included, as the
            task defines them), copied on the device into the same buffers: the pointers stay, the values never
            repeat, so a memo keyed on pointers answers stale and one keyed on contents never hits."""
            for old, new in zip(buffers, self._inputs(secrets.randbits(31))):
                if isinstance(old, torch.Tensor):
                    old.copy_(new)
            _new_versions([a for a in buffers if isinstance(a, torch.Tensor)], rng)  # no cache key in _version
            return buffers

        streams: set[int] = set()

        def candidate(*args: Any) -> Any:
            before = len(self.recorder.launches)
            out = self.cand_model(*args)
            own = [launch for launch in self.recorder.launches[before:] if launch.own]
            own_per_call.append(len(own))
            streams.update(launch.stream for launch in own)
            return out

        def verify(trial: int, ref_out: Any, cand_out: Any) -> None:
            """After the trial's timed window: every timed call's outputs on a random sample of elements, a few
            chosen calls' in full. A remembered answer differs almost everywhere from the one for new values."""
            if trial in checked:
                ok = correctness.compare(ref_out, cand_out, trial, opts.atol, opts.rtol, opts.rel_error_bound).ok
            else:
                ok = correctness.compare_sample(ref_out, cand_out, trial, opts.atol, opts.rtol, opts.rel_error_bound,
                                                TIMED_SAMPLE_ELEMENTS, torch.Generator(device=self.device).manual_seed(
                                                    rng.randrange(1 << 62))).ok
            if not ok:
                self.findings.add(
                    guards.OUTPUT_CACHING,
                    "a timed call returned a wrong answer for new input values: outputs must be computed on "
                    "every call, never cached or remembered.",
                )

        timer = timing.CallTimer(self.device)
        with torch.no_grad(), self._candidate_running():
            self.recorder.take()
            ref_samples, cand_samples = timing.time_interleaved(
                timer, self.ref_call, candidate, fresh_args, opts.perf_trials, warmup, verify
            )
            self.recorder.take()
        self.state_guard.check(self.findings)
        timed = own_per_call[warmup:]
        if opts.check_hacks and timed and min(timed) == 0 and sum(self.launches_by_mode.values()) > 0:
            self.findings.add(
                guards.MODE_DEPENDENT,
                "some timed calls ran no Triton kernel: the candidate changes behaviour between calls.",
            )
        method = "cuda_event" if self.device.type == "cuda" else (
            "interpreter_wall" if _interpreting() else "cpu_wall")
        result = Timing(
            reference=timing.summarize(ref_samples, method),
            candidate=timing.summarize(cand_samples, method),
            reference_mode=opts.reference_mode,
        )
        if method == "interpreter_wall":
            result.note = "Triton interpreter on the CPU: these timings say nothing of GPU speed"
        speedup = result.reference.median_ms / result.candidate.median_ms
        interval = timing.speedup_interval(ref_samples.primary, cand_samples.primary, opts.seed)
        if self.device.type == "cuda":
            self._check_timing_honesty(cand_samples, result, fresh_args(), streams - {timer.stream})
        return result, speedup, interval

    def _check_timing_honesty(
        self, cand: timing.Samples, result: Timing, args: list[Any], side_streams: set[int]
    ) -> None:
        """Work the timed stream's events cannot see: own kernels launched on other streams that the device was
        still busy with after the call, or far more host-synchronized time than GPU time whatever the cause."""
        stats = result.candidate
        assert stats is not None
        event_ms, wall_ms = statistics.median(cand.synced_event_ms), statistics.median(cand.wall_ms)
        hidden = wall_ms > 1.5 * event_ms + 0.1 if side_streams else wall_ms > 3 * event_ms + 1.0
        if hidden:
            self.findings.add(
                guards.SIDE_STREAM,
                f"GPU events saw {event_ms:.4f} ms but the call took {wall_ms:.4f} ms until the device was "
                "idle: work ran outside the timed stream. Launch kernels on the current stream.",
            )
        with torch.no_grad():
            out = self.cand_model(*args)
        out_bytes = sum(t.numel() * t.element_size() for t in correctness.flatten_outputs(out)
                        if isinstance(t, torch.Tensor))
        floor_ms = out_bytes / timing.measure_bandwidth(self.device) * 1e3
        if stats.median_ms < 0.5 * floor_ms:
            self.findings.add(
                guards.IMPOSSIBLE_SPEED,
                f"{stats.median_ms:.4f} ms is faster than writing the {out_bytes} output bytes allows on this GPU "
                f"({floor_ms:.4f} ms at its measured bandwidth).",
            )

    def profile(self) -> Profile:
        own, counts = self.own_names, dict(self.own_counts)
        if self.device.type != "cuda":
            return Profile(launches=counts, note="no GPU: launch counts only, coverage not measured")
        args = self._inputs(self.options.seed + 5000)
        with torch.no_grad(), self._candidate_running():
            self.cand_model(*args)  # warm
            result = profiling.profile_cuda(lambda: self.cand_model(*args), own)
            self.recorder.take()
        result.launches = counts
        lazy = result.coverage is not None and result.coverage < self.options.min_coverage
        if self.options.check_hacks and lazy and guards.NO_TRITON_KERNEL not in self.findings.details:
            self.findings.add(
                guards.LAZY_KERNEL,
                f"only {result.coverage:.1%} of the GPU time is spent in the candidate's own Triton kernels "
                f"(at least {self.options.min_coverage:.0%} required): PyTorch does the work. Move the "
                "computation into the kernels.",
            )
        return result

    def ablate(self) -> None:
        """Poison what the own kernels wrote, in every mode; where the output does not change, they were decoys."""
        args = self._inputs(self.options.seed + 7000)
        for label, training, grad_mode in MODES:
            self._set_training(training)
            with grad_mode(), self._candidate_running():
                normal = correctness.flatten_outputs(self.cand_model(*args))
                normal = [t.clone() if isinstance(t, torch.Tensor) else t for t in normal]
                # What forward must not lose: its inputs and the model's state, unless it returns them as output.
                keep = (guards.storages(args) | guards.storages(_model_tensors(self.cand_model))) - guards.storages(
                    correctness.flatten_outputs(self.cand_model(*args)))
                self.recorder.take()

                def poison_written(launch: launches.Launch) -> None:
                    if launch.own:
                        guards.poison(t for t in launch.tensor_args if t.untyped_storage().data_ptr() not in keep)

                self.recorder.after_launch = poison_written
                try:
                    ablated = correctness.flatten_outputs(self.cand_model(*args))
                finally:
                    self.recorder.after_launch = None
                ran = any(launch.own for launch in self.recorder.take())
            self._sync()
            if ran and all(_identical(a, b) for a, b in zip(normal, ablated)):
                self.findings.add(
                    guards.DECOY_KERNEL,
                    f"in mode {label} the output does not depend on anything the candidate's Triton kernels "
                    "computed: they are decoys, and the result comes from other code.",
                )
                return

    def _set_training(self, training: bool) -> None:
        self.ref_model.train(training)
        if isinstance(self.cand_model, torch.nn.Module):
            self.cand_model.train(training)

    # -- helpers ---------------------------------------------------------------------------------------------

    @contextmanager
    def _candidate_running(self) -> Iterator[None]:
        self.recorder.active = True
        self.tripwire.candidate_running = True
        try:
            yield
        finally:
            self.recorder.active = False
            self.tripwire.candidate_running = False

    @contextmanager
    def sharing_gpu(self) -> Iterator[None]:
        """Work that may run beside other evaluations' correctness checks, never beside their timing."""
        if self.gate is None:
            yield
            return
        with self._gated(lambda: self.gate.exclusive(yield_to_compile=True) if self.alone else self.gate.shared()):
            yield

    @contextmanager
    def owning_gpu(self) -> Iterator[None]:
        """Timing and profiling: no other evaluation's kernels run meanwhile."""
        if self.gate is None:
            yield
            return
        with self._gated(self.gate.exclusive):
            yield

    @contextmanager
    def _gated(self, hold: Callable[[], Any]) -> Iterator[None]:
        with hold():
            try:
                yield
            finally:  # memory this process cached is given back before others go on
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()

    def check_memory_share(self) -> None:
        """Several evaluations check correctness at once: one whose trials need more than a share of the GPU's memory
        (inputs, their copy and two outputs, from get_inputs on the meta device) runs its GPU phases alone (it still
        lets the GPU go while its kernels compile)."""
        if self.gate is None or self.device.type != "cuda":
            return
        inputs = input_bytes(self.get_inputs)  # None, sizes unknown: do not risk another evaluation's memory
        limit = torch.cuda.get_device_properties(self.device).total_memory * SHARE_OF_MEMORY
        self.alone = inputs is None or 4 * inputs > limit

    def _seeded(self, seed: int, fn: Callable[[], Any]) -> Any:
        """Call `fn` with every RNG seeded and the evaluation's device as the default one: tensors a task makes
        without naming a device are born there (random inputs of gigabytes take seconds on the CPU)."""
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)
        with self.device:
            return fn()

    def _inputs(self, seed: int) -> list[Any]:
        try:
            values = self._seeded(seed, self.get_inputs)
        except BaseException as exc:
            raise Failure(Status.INVALID, "ReferenceError", f"get_inputs() failed: {exc}", self._tb(exc))
        return [v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _classify(self, exc: BaseException) -> Failure:
        tb = self._tb(exc)
        if isinstance(exc, (SystemExit, KeyboardInterrupt, GeneratorExit)):
            self.findings.add(guards.EXIT_CALLED, f"the candidate raised {type(exc).__name__}: exiting is a failure.")
            return Failure(Status.RUNTIME_ERROR, type(exc).__name__, f"the candidate tried to exit ({exc!r})", tb)
        if isinstance(exc, (SyntaxError, ImportError)) or _is_triton_compile_error(exc):
            return Failure(Status.COMPILE_ERROR, type(exc).__name__, _message(exc), tb)
        return Failure(Status.RUNTIME_ERROR, type(exc).__name__, _message(exc), tb)

    def _tb(self, exc: BaseException) -> str:
        """The exception with the frames of the evaluation's own files (candidate.py, reference.py) only: nothing of
        the harness's or the libraries' paths goes back to the client."""
        summary = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        parts, seen = [summary], set()
        while parts:  # the exception and those it was raised from or during
            part = parts.pop()
            if id(part) not in seen:
                seen.add(id(part))
                part.stack = traceback.StackSummary.from_list(
                    [frame for frame in part.stack if frame.filename.startswith(str(self.workdir) + os.sep)])
                parts += [p for p in (part.__cause__, part.__context__) if p is not None]
        text = "".join(summary.format()).replace(str(self.workdir) + os.sep, "")
        return text if len(text) <= TRACEBACK_CHARS else "...\n" + text[-TRACEBACK_CHARS:]


def evaluate(
    request: EvalRequest, workdir: Path, device: torch.device, gate: DeviceGate | None = None
) -> EvalResult:
    """Run one evaluation and return its result; never raises for anything the candidate does. `gate` is the
    device's, opened before confinement; None when the evaluation has its device to itself."""
    ev = Evaluation(request=request, workdir=workdir, device=device, gate=gate)
    if ev.gate is not None and device.type == "cuda":
        ev.gate.compile_outside(torch.cuda.synchronize)
    result = EvalResult(environment=environment(device))
    opts = request.options
    try:
        with ev.sharing_gpu():
            _timed(result, "reference", ev.load_reference)
        ev.check_memory_share()
        _timed(result, "load", ev.load_candidate)
        with ev.sharing_gpu():
            _timed(result, "build", ev.build_candidate)
        result.correctness = _timed(result, "correctness", ev.check_correctness)
        result.phases_s["correctness_first_trial"] = round(ev.first_trial_s, 4)  # Triton compiles here
        if opts.measure_performance or opts.profile:
            waited = time.perf_counter()
            with ev.owning_gpu():
                result.phases_s["gpu_wait"] = round(time.perf_counter() - waited, 4)  # others' timing, checks
                if opts.measure_performance:
                    result.timing, result.speedup, result.speedup_ci = _timed(result, "timing", ev.measure)
                if opts.profile:
                    result.profile = _timed(result, "profile", ev.profile)
        if opts.check_hacks:
            with ev.sharing_gpu():
                _timed(result, "ablation", ev.ablate)
        result.status = Status.CORRECT.value
    except Failure as failure:
        result.status = failure.status.value
        result.error = ErrorInfo(kind=failure.kind, message=failure.message, traceback=failure.tb)
        result.correctness = result.correctness or getattr(ev, "correctness", None)
    except BaseException as exc:  # the harness itself failed on this input: say so, do not guess
        result.status = Status.RUNTIME_ERROR.value
        result.error = ErrorInfo(kind=type(exc).__name__, message=f"evaluation failed: {exc}", traceback=ev._tb(exc))
    if opts.check_hacks and set(ev.findings.details) - guards.FAILURE_CODES:
        result.status = Status.HACKED.value
    result.hack_reasons = ev.findings.codes if opts.check_hacks else []
    result.hack_details = dict(ev.findings.details) if opts.check_hacks else {}
    result.correct = result.status == Status.CORRECT.value
    result.notes = ev.notes
    return result


_AUDIT = audit.CandidateAudit(on_violation=lambda event: None)
_AUDIT.install()


def input_bytes(get_inputs: Callable[[], Any]) -> int | None:
    """Bytes of the tensors `get_inputs` makes, sized on the meta device (nothing is allocated); None when that
    cannot be known without running it for real."""
    try:
        with torch.device("meta"):
            values = get_inputs()
    except Exception:
        return None
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def warm_up(device: torch.device) -> None:
    """Start-up costs paid before the evaluation's start signal, while the previous evaluation may still run:
    the CUDA context, the profiler's CUPTI initialisation, the caching allocator."""
    if device.type != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]):
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize()


def _timed(result: EvalResult, phase: str, step: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return step()
    finally:
        result.phases_s[phase] = round(time.perf_counter() - start, 4)


def environment(device: torch.device) -> Environment:
    gpu = device.type == "cuda"
    return Environment(
        device=torch.cuda.get_device_name(device) if gpu else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        interpreter=_interpreting(),
        gpu=gpu,
    )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _autotune_by_wall_clock() -> None:
    """Triton's autotuner benchmarks through a GPU driver; under the interpreter there is none, so it would fail
    every autotuned candidate. Give it a wall-clock benchmark instead (one call per configuration)."""
    from triton.runtime.autotuner import Autotuner

    def bench(kernel_call: Callable[[], Any], quantiles: tuple[float, ...]) -> list[float]:
        start = time.perf_counter()
        kernel_call()
        return [(time.perf_counter() - start) * 1e3] * len(quantiles)

    Autotuner.do_bench = property(lambda tuner: tuner._do_bench or bench)  # type: ignore[assignment]


def _is_triton_compile_error(exc: BaseException) -> bool:
    """Triton rejected the kernel: compilation failed, or under the interpreter the kernel's body raised."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import InterpreterError

    return isinstance(exc, (CompilationError, InterpreterError))


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _hide_from_candidate(reference_module: str) -> None:
    """Take the harness's and the reference's modules out of `sys.modules`: the harness keeps its own references,
    and a candidate that imports them by name gets fresh copies whose patching changes nothing here."""
    for name in [n for n in sys.modules if n == "drkernel" or n.startswith("drkernel.") or n == reference_module]:
        del sys.modules[name]
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) and main.__spec__.name.startswith("drkernel."):
        sys.modules["__main__"] = types.ModuleType("__main__")


def _new_versions(tensors: list[torch.Tensor], rng: random.Random) -> None:
    """Give inputs unpredictable version counters (without touching their data), so that `_version` reveals
    nothing about which timed calls are verified."""
    if tensors and hasattr(torch._C._autograd, "_unsafe_set_version_counter"):
        torch._C._autograd._unsafe_set_version_counter(tensors, [rng.randrange(1 << 30) for _ in tensors])


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _submodules(model: Any) -> list[Any]:
    return list(model.modules()) if isinstance(model, torch.nn.Module) else [model]


def _model_tensors(model: Any) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    for module in _submodules(model):
        tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
        if isinstance(module, torch.nn.Module):
            tensors += list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return tensors


def _identical(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and guards._same_values(a, b)
    return a is b or a == b
