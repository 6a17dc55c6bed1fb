"""The subject: the process that imports and runs the candidate, on the judge's orders.

It never sees the reference, the trial seeds or the verdict. The judge (drkernel.sandbox.judge) sends it inputs and
asks for calls; it answers with the outputs (which the judge compares itself), its own timing of timed calls (which
the judge checks against the wall time it observed), its launch records and profile, and what its runtime checks
saw (findings). Everything it says is evidence for the judge, never a verdict: once the candidate has run, this
process is the candidate's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import types
from collections import Counter
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from drkernel.sandbox import (
    audit, channel, correctness, guards, launches, loading, profiling, relay, static_checks, timing,
)
from drkernel.sandbox.channel import Channel, Encoder
from drkernel.schema import Status

# (label, training, autograd context): every candidate must run its own Triton kernels in each.
MODES: dict[str, tuple[bool, Callable[[], Any]]] = {
    "train+grad": (True, torch.enable_grad),
    "eval+no_grad": (False, torch.no_grad),
    "train+no_grad": (True, torch.no_grad),
    "eval+inference_mode": (False, torch.inference_mode),
    "eval+grad": (False, torch.enable_grad),
}
# cudaErrorMapBufferObjectFailed as PyTorch words it: mapping another process's memory failed, a resource of the
# driver's, never a bug of a kernel; where it surfaces after the mapping (the first copy that reads it), it is the
# harness's failure all the same.
MAPPING_FAILED = "mapping of buffer object failed"


# A timed call's outputs up to this size are copied into buffers the judge maps once per timing phase
# (drkernel.sandbox.subject_link.TimedCalls); larger ones (a copy would cost memory the largest problems lack) are
# shared call by call, where mapping costs little beside the call itself.
STAGED_BYTES = 256 << 20


class Refusal(Exception):
    """Ends the subject's part with a classified failure (the judge turns it into the verdict): the candidate's, or
    the harness's own (`SandboxError`)."""

    def __init__(self, status: Status, kind: str, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.failure = {"status": status.value, "kind": kind, "message": message, "traceback": tb}


class Subject:
    def __init__(self, conn: Channel, scratch: Path, device: torch.device, gate_hooks: bool,
                 confinement: dict[str, str] | None = None) -> None:
        self.conn, self.scratch, self.device = conn, scratch, device
        self.confinement = confinement or {}  # what confined this process (drkernel.sandbox.confine), for the judge
        self.findings = guards.Findings()
        self.recorder = launches.LaunchRecorder()
        self.sent = Encoder()  # what the judge may still be reading
        # The timed calls' inputs, this process's own memory, refilled before every call: on a GPU by the judge, which
        # maps them once per timing phase (`stage`); else from the values each call brings.
        self.buffers: list[Any] | None = None
        self.timer: timing.CallTimer | None = None
        self.placed: timing.Placements | None = None  # for one timing phase: where a small call's tensors go round
        # On a GPU, for one timing phase: this process's output buffers, mapped once by the judge; every timed call's
        # outputs are copied into them (drkernel.sandbox.subject_link.TimedCalls).
        self.out_staging: Any = None
        self.gate_hooks = gate_hooks
        self.mapping_s = 0.0  # this request's time spent mapping the judge's inputs
        self.last_mapped: Any = None  # the judge's values mapped last (see `_mapped`)
        audit.pin_methods(self)  # as its class is now: a method swapped on the class later does not reach it

    # -- the loop ----------------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Answer the judge's requests until `finish`: the harness's thread holds the channel, the handlers and the
        candidate run on a thread of their own that cannot reach it (drkernel.sandbox.relay)."""
        self.thread = relay.CandidateThread(self.conn, self._answer)
        self.thread.serve()

    def _answer(self, header: dict[str, Any], payloads: list[bytearray]) -> tuple[dict[str, Any], list[bytes]]:
        handlers = {"load": self.load, "call": self.call, "stage": self.stage, "warm": self.warm, "time": self.time,
                    "profile": self.profile, "ablate": self.ablate, "release": self.release, "finish": self.finish}
        self.thread.collect()
        op = header.get("op")
        self.sent = Encoder()  # the judge has read the last reply: its memory may go
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()  # shared blocks the judge has let go of are freed only here
        started, self.mapping_s = time.perf_counter(), 0.0
        try:
            reply = handlers[op](header, payloads)
        except Refusal as refusal:
            reply = {"failure": refusal.failure}
        except BaseException as exc:  # the candidate raised outside a checked call (ablation, profiling, timing)
            reply = {"failure": self._classify(exc).failure}
        self._sync()  # what the judge reads next is written, and what it wrote is read: no event is relied on
        reply["findings"] = dict(self.findings.details)
        if self.device.type == "cuda":  # the most this process's allocator held during the request
            reply["peak_bytes"] = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        reply["busy_s"] = time.perf_counter() - started - self.mapping_s  # the rest is the hand-over's cost
        return reply, self.sent.payloads

    def _inputs(self, header: dict[str, Any], payloads: list[bytearray]) -> list[Any]:
        """The judge's inputs, copied into this process's own memory (the judge's stay the judge's)."""
        return self._own_copy(self._mapped(header, payloads))

    def _own_copy(self, values: list[Any]) -> list[Any]:
        with self._harness_memory():
            return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]

    @contextmanager
    def _harness_memory(self) -> Iterator[None]:
        """The harness's own copies in this process: one that finds no GPU memory left (taken by other evaluations,
        or a policy generating on the same GPU) is the harness's failure, `crashed` with `SandboxError`, which the
        scheduler runs again, not the candidate's `runtime_error` (seen on an H100 when two large evaluations were
        let check at once)."""
        try:
            yield
        except torch.OutOfMemoryError as exc:
            raise Refusal(Status.CRASHED, "SandboxError",
                          f"the candidate's process found no GPU memory for the harness's copy of its values: {exc}")

    def _mapped(self, header: dict[str, Any], payloads: list[bytearray]) -> Any:
        """The judge's inputs as it sent them (on a GPU, its memory mapped here); the time it takes is the hand-over's.
        A mapping that fails is the harness's failure, as the judge's own CUDA errors are:
        `cudaErrorMapBufferObjectFailed` reached a legitimate candidate as `runtime_error` in 1 of 20 evaluations of
        a matmul beside others on an H100."""
        start = time.perf_counter()
        try:
            values = channel.decode(header["inputs"], payloads, self.device)
        except (torch.AcceleratorError, torch.OutOfMemoryError) as exc:
            raise Refusal(Status.CRASHED, "SandboxError",
                          f"the candidate's process could not map the judge's values ({type(exc).__name__}: {exc})")
        finally:
            self.mapping_s += time.perf_counter() - start
        # Kept mapped until the next request's are: the judge's next copies mostly lie in the same allocation, which
        # is then found open instead of opened and closed again (calls that take the driver's lock for the host).
        self.last_mapped = values
        return values

    # -- load and build ------------------------------------------------------------------------------------------

    def load(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        self.check_hacks, self.allow_glue = bool(header["check_hacks"]), bool(header["allow_torch_glue"])
        init_inputs = self._inputs({"inputs": header["init_inputs"]}, payloads)
        source = header["candidate"]
        notes = [f"static: {n}" for n in static_checks.inspect_source(source).notes()]
        self.cand_path = self.scratch / "candidate.py"
        self.recorder.own_files = {str(self.cand_path)}
        self.recorder.install()
        if self.gate_hooks:
            self._yield_gpu_to_compile()
        harness = [m for name, m in sys.modules.items() if name.startswith("drkernel.")]
        self.thread_origins = guards.ThreadOrigins(str(self.cand_path))
        self.state_guard = guards.StateGuard(harness)
        audit.AUDIT.watch(str(self.cand_path), [str(self.scratch), os.environ.get("TRITON_CACHE_DIR", "")],
                          self._sandbox_violation)
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            _autotune_by_wall_clock()
        _hide_harness()
        with self._candidate_running():
            try:
                module = loading.load_module(source, self.cand_path, f"drkernel_candidate_{os.getpid()}")
            except loading.SourceLoadError as exc:
                raise self._classify(exc.__cause__ or exc)
        self.state_guard.check(self.findings)
        if not hasattr(module, "ModelNew"):
            raise Refusal(Status.INVALID, "NoModelNew", "the candidate defines no class ModelNew")
        with self._candidate_running():
            try:
                model = loading.seeded(int(header["seed"]), self.device, lambda: module.ModelNew(*init_inputs))
                self.model = model.to(self.device) if isinstance(model, torch.nn.Module) else model
            except BaseException as exc:
                raise self._classify(exc)
        self.state_guard.check(self.findings)
        channel_layer = self.thread.filtered or "the candidate's threads cannot reach it (seccomp)"
        return {"notes": notes, "confinement": {**self.confinement, "channel": channel_layer}}

    # -- calls -----------------------------------------------------------------------------------------------

    def call(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        """One checked call in a mode (correctness trials): the outputs, how many own kernels ran. The judge's inputs
        (mapped, not copied, on a GPU) are the pristine values the call's copy is compared with afterwards."""
        pristine = self._mapped(header, payloads)
        args = self._own_copy(pristine)
        training, grad_mode = MODES[header["mode"]]
        self._set_training(training)
        with grad_mode():
            out, own = self._checked_call(args, pristine)
        self._sync()
        self._check_outputs(args, out)
        if header.get("forget_inputs"):  # a large evaluation's: kept mapped, the judge's copy could not be freed
            self.last_mapped = None  # before its next trial's, which then takes a segment of the input's size more
        return {"outputs": self.sent.encode(out), "own": own}  # own kernel name -> launches

    def stage(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        """A timing phase's input buffers, made like the judge's values (contiguous) and shared with it: the judge
        writes every call's fresh values into them, one copy per call and none here. Kept until `release`."""
        self.buffers = self._own_copy(self._mapped(header, payloads))
        return {"inputs": self.sent.encode(self.buffers)}

    def _timed_inputs(self, header: dict[str, Any], payloads: list[bytearray]) -> list[Any]:
        """The inputs of a warm-up or timed call: this process's own buffers, refilled by the judge (staged: handed to
        the candidate as new views of them each call, so that no tensor it rebinds or resizes keeps it from the
        values written) or from the values sent. The reference, too, reads its own process's memory; a candidate
        called on the judge's mapped buffers measured 7-53% slower in 7 of 30 evaluations of a matmul on an H100
        (against 3.085 ms in the others; cause not established). The judge's writes come from another process, which
        PyTorch here cannot see: the buffers' version counters are bumped as a copy in this process would bump them,
        so that whatever is keyed on a tensor's version (a legitimate cache of derived data too) sees new values."""
        if header.get("staged"):
            if self.buffers is None:
                raise channel.BadMessage("a staged call before the timing phase's buffers were staged")
            torch.autograd.graph.increment_version([v for v in self.buffers if isinstance(v, torch.Tensor)])
            return [v.view_as(v) if isinstance(v, torch.Tensor) else v for v in self.buffers]
        values = self._mapped(header, payloads)
        if self.buffers is None:
            self.buffers = self._own_copy(values)
        else:
            for old, new in zip(self.buffers, values):
                if isinstance(old, torch.Tensor):
                    old.copy_(new)
        return self.buffers

    def _handed_over(self, header: dict[str, Any], out: Any) -> dict[str, Any]:
        """A timed call's outputs for the judge: staged (below), or sent with the reply."""
        return self._staged(header, out) or {"outputs": self.sent.encode(out)}

    def _staged(self, header: dict[str, Any], out: Any) -> dict[str, Any] | None:
        """Outputs copied into the output buffers the judge has mapped (made and shared anew, once, when their
        structure changes); None where a call's outputs do not go that way (an unstaged call, `_stageable`)."""
        if not (header.get("staged") and _stageable(out)):
            return None
        if self.out_staging is not None and _copy_into(self.out_staging, out):
            return {"outputs_staged": True}
        with self._harness_memory():
            self.out_staging = _cloned(out)
        return {"outputs": self.sent.encode(self.out_staging), "staging": True}

    def warm(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        """An untimed call before timing: its host time sets the device spin that hides launch overhead. The timer is
        made here: no timed call pays for setting it up."""
        args = self._timed_inputs(header, payloads)
        self._set_training(False)
        with timing.collector_paused(), torch.no_grad(), self._candidate_running():
            start = time.perf_counter()
            out = self.model(*args)
            host_ms = (time.perf_counter() - start) * 1e3
        self._sync()
        if self.timer is None:
            self.timer = timing.CallTimer(self.device)
        if self.placed is None:
            with self._harness_memory():
                self.placed = timing.Placements.for_call(self.device, [args, out])
                self.placed.reserve([args, out])
        # The output buffers are made here, from the warm-up's outputs, so that no timed call meets the allocator
        # short of the block they take: made after the first timed call, they left the second to take a segment
        # from the driver while timed (15 of the RL-shaped batch's 1,040 timed calls on an H100).
        return {"host_ms": host_ms, **(self._staged(header, out) or {})}

    def time(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        """One timed call on fresh values in the same input tensors (or, with `null`, the same steps around no call
        at all: the judge calibrates its wall-clock view of this process with it)."""
        assert self.timer is not None and self.placed is not None, "the judge warms up before it times"
        with self._harness_memory():
            args = self.placed.place(self._timed_inputs(header, payloads))
        self.timer.cover_ms = float(header["spin_ms"])
        null = bool(header.get("null"))
        self._set_training(False)
        self.recorder.take()
        with torch.no_grad(), self._candidate_running():  # the judge's clock stops once the device is idle
            out, event_ms, host_ms = self.timer.timed(_nothing if null else self.model, args,
                                                      on_idle=lambda: self.thread.tell({"timed": True}))
        own = [launch for launch in self.recorder.take() if launch.own]
        if self.timer.l2_tampered:
            self.findings.add(guards.L2_PERSISTENCE, "the candidate changed the GPU's persisting-L2 settings (a "
                              "carve-out or an access-policy window): timed calls must meet a flushed cache.")
        handed = {} if null else self._handed_over(header, out)  # the judge's clock stopped at the signal above
        self.placed.keep(args, out)
        return {"event_ms": event_ms, "unjoined_ms": self.timer.unjoined_ms, "host_ms": host_ms,
                "host_interruptions": self.timer.interruptions,
                "driver_allocations": self.timer.driver_allocations, "own": len(own), **handed}

    def profile(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        """The GPU time of calls on fresh inputs (a warm-up, then one profiled call per input set), split into own
        kernels and the rest; their outputs go to the judge, which checks them: coverage only counts for calls that
        computed the right answer, and no call repeats an input a memo could answer from."""
        sets = [self._own_copy(values) for values in self._mapped(header, payloads)]
        own = set(header["own_names"])
        self._set_training(False)
        with torch.no_grad(), self._candidate_running():
            self.model(*sets.pop(0))  # warm; its inputs and outputs go before the profiled calls
            outputs: list[Any] = []
            result = profiling.profile_cuda([lambda args=args: self.model(*args) for args in sets], own,
                                            after=lambda out: outputs.append(_cloned(out)))
            self.recorder.take()
        return {"profile": dataclasses.asdict(result), "outputs": self.sent.encode(outputs)}

    def ablate(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        """The output of a call, then of the same call again with whatever the own kernels wrote poisoned right after
        each of their launches: the judge compares the two (equal: the kernels were decoys). Also whether a call on
        new tensors holding the same values launched the same own kernels (not: forward answers values it has seen
        from memory; a cache keyed on the tensors themselves is not asked about here, fresh values defeat it).
        The call on the new tensors comes first and its tensors go before the next: at most two inputs and an output,
        or an input and two outputs, are held at once (a 6 GiB problem's ablation held 36 GiB here with all four)."""
        args = self._inputs(header, payloads)
        anew = self._own_copy(args)  # the same values in new tensors
        if header.get("forget_inputs"):  # a large evaluation's: the judge's copy can go before the next mode's
            self.last_mapped = None
        training, grad_mode = MODES[header["mode"]]
        self._set_training(training)
        with grad_mode(), self._candidate_running():
            self.recorder.take()
            self.model(*anew)
            first = _own_names(self.recorder.take())
            del anew
            outputs = correctness.flatten_outputs(self.model(*args))
            again = _own_names(self.recorder.take())
            normal = [t.clone() if isinstance(t, torch.Tensor) else t for t in outputs]
            # What forward must not lose: its inputs and the model's state, unless it returns them as output.
            keep = (guards.storages(args) | guards.storages(_model_tensors(self.model))) - guards.storages(outputs)
            del outputs

            def poison_written(launch: launches.Launch) -> None:
                if launch.own:
                    guards.poison(t for t in launch.tensor_args if t.untyped_storage().data_ptr() not in keep)

            self.recorder.after_launch = poison_written
            try:
                ablated = correctness.flatten_outputs(self.model(*args))
            finally:
                self.recorder.after_launch = None
            ran = any(launch.own for launch in self.recorder.take())
        self._sync()
        return {"normal": self.sent.encode(normal), "ablated": self.sent.encode(list(ablated)), "ran": ran,
                "repeat_differs": first != again}

    def release(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        """The judge lets the GPU go to other evaluations: let the phase's buffers go, and give the memory cached
        back to the driver if the judge says so (`gpu_policy.frees_cached_memory`)."""
        self.buffers = self.timer = self.placed = self.out_staging = self.last_mapped = None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.ipc_collect()
            if header.get("give_back", True):
                torch.cuda.empty_cache()
        return {}

    def finish(self, header: dict[str, Any], payloads: list[bytearray]) -> dict[str, Any]:
        self.state_guard.check(self.findings)
        return {}

    # -- checks around every call ----------------------------------------------------------------------------

    def _checked_call(self, args: list[Any], pristine: list[Any]) -> tuple[Any, dict[str, int]]:
        threads_before, started_before = self.thread_origins.alive(), self.thread_origins.started
        children_before = guards.live_children()
        self.recorder.take()
        ops: Counter[str] = Counter()
        with self._candidate_running(), guards.op_recorder(ops) if not self.allow_glue else nullcontext():
            try:
                out = self.model(*args)
            except BaseException as exc:
                raise self._classify(exc)
        failed = self.recorder.failed_launches()
        own = [launch for launch in self.recorder.take() if launch.own]
        if failed:
            self.findings.add(
                guards.TORCH_FALLBACK,
                f"A Triton kernel ({failed[0]}) failed and forward still returned: the candidate caught the error "
                "and fell back to other code. Fix the kernel instead of catching its failure.",
            )
        if guards.compute_ops(ops):
            used = ", ".join(f"{op} x{n}" for op, n in sorted(guards.compute_ops(ops).items()))
            self.findings.add(
                guards.TORCH_COMPUTE,
                f"forward computes with PyTorch operators ({used}); this evaluation allows no PyTorch compute "
                "around the Triton kernels.",
            )
        changed = guards.mutated_inputs(pristine, args)
        if changed:
            self.findings.add(
                guards.INPUT_MUTATION,
                f"forward changed its input(s) {changed} in place; inputs must be left as they are.",
            )
        threads = sorted(set(self.thread_origins.alive()) | set(threads_before))
        started = self.thread_origins.started - started_before
        new_children = guards.live_children() and not children_before
        if threads or started or new_children:
            self.findings.add(
                guards.BACKGROUND_WORK,
                f"forward worked outside its own thread (threads started: {started}, running: {threads or 'none'}, "
                f"a process still running: {'yes' if new_children else 'no'}): all work must be done, on the GPU's "
                "current stream, before forward returns.",
            )
        self.state_guard.check(self.findings)
        return out, dict(Counter(launch.name for launch in own))

    def _check_outputs(self, args: list[Any], out: Any) -> None:
        outputs = correctness.flatten_outputs(out)
        fakes = guards.fake_outputs(outputs)
        if fakes:
            self.findings.add(guards.FAKE_OUTPUT, f"{'; '.join(fakes)}: outputs must be plain torch.Tensor objects.")
        if guards.storages(outputs) & guards.storages(args):
            self.findings.add(guards.OUTPUT_ALIASES_INPUT,
                              "an output shares memory with an input; the reference returns new tensors.")

    def _sandbox_violation(self, event: str) -> None:
        self.findings.add(
            guards.SANDBOX_VIOLATION,
            f"the candidate called {event}: introspecting the harness (frames, gc), writing files outside its "
            "scratch space, ctypes or CUDA's own Python bindings, signals, processes and sockets are not allowed "
            "in a kernel.",
        )

    def _yield_gpu_to_compile(self) -> None:
        """Triton compiles a kernel on the CPU at its first launch: the judge lets the GPU's gate go meanwhile
        (after this process's queued work is done), so another evaluation's timing can run."""
        from triton import knobs

        if not hasattr(knobs.runtime, "jit_post_compile_hook"):
            return
        state = {"compiling": False}
        # Sealed: Triton's knobs are the candidate's to read, and a closure over this object would hand it over.
        before = audit.sealed(_compile_started, (self.thread.tell, torch.cuda.synchronize, state), "compile_started")
        after = audit.sealed(_compile_ended, (self.thread.ask, state), "compile_ended")
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = before, after

    # -- helpers ---------------------------------------------------------------------------------------------

    @contextmanager
    def _candidate_running(self) -> Iterator[None]:
        self.recorder.active = True
        try:
            yield
        finally:
            self.recorder.active = False

    def _set_training(self, training: bool) -> None:
        if isinstance(self.model, torch.nn.Module):
            self.model.train(training)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _classify(self, exc: BaseException) -> Refusal:
        tb = loading.trimmed_traceback(exc, self.scratch)
        if isinstance(exc, torch.AcceleratorError) and MAPPING_FAILED in str(exc):
            # seen on an H100 in a correctness call of a legitimate candidate, with none of its frames on the stack
            return Refusal(Status.CRASHED, "SandboxError", f"mapping the judge's memory failed: {_message(exc)}", tb)
        if isinstance(exc, (SystemExit, KeyboardInterrupt, GeneratorExit)):
            self.findings.add(guards.EXIT_CALLED, f"the candidate raised {type(exc).__name__}: exiting is a failure.")
            return Refusal(Status.RUNTIME_ERROR, type(exc).__name__, f"the candidate tried to exit ({exc!r})", tb)
        if isinstance(exc, (SyntaxError, ImportError)) or _is_triton_compile_error(exc):
            return Refusal(Status.COMPILE_ERROR, type(exc).__name__, _message(exc), tb)
        return Refusal(Status.RUNTIME_ERROR, type(exc).__name__, _message(exc), tb)


def _nothing(*args: Any) -> None:
    """The null call: the judge's calibration of what a timed call costs around the call itself."""


def _compile_started(*args: Any, **kwargs: Any) -> None:
    """Triton's hook before a compilation: the judge is told once this process's queued work is done (`sealed`)."""
    tell, sync, state = "drkernel.audit.sealed"  # type: ignore[misc]
    if not state["compiling"]:
        sync()
        tell({"compile": "start"})
        state["compiling"] = True
    return None  # anything true would make Triton skip the compilation


def _compile_ended(*args: Any, **kwargs: Any) -> None:
    """Triton's hook after a compilation: returns once the judge holds the gate again (`sealed`)."""
    ask, state = "drkernel.audit.sealed"  # type: ignore[misc]
    if state["compiling"]:
        state["compiling"] = False
        ask({"compile": "end"})


def _cloned(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_cloned(v) for v in value)
    return value


def _stageable(out: Any) -> bool:
    """Outputs that go to the judge through the output buffers it maps: all on the GPU (a CPU tensor crosses as
    bytes: the judge holds a copy, not a mapping), and not over STAGED_BYTES."""
    return all(t.is_cuda for t in correctness.tensors_in(out)) and correctness.tensor_bytes(out) <= STAGED_BYTES


def _copy_into(target: Any, value: Any) -> bool:
    """Copy `value` into `target` (as `_cloned` made it) where both have one structure: the same nesting, tensors of
    one shape, dtype and device, equal plain values; False, with nothing copied, where they differ."""
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    if not _paired(target, value, pairs):
        return False
    for a, b in pairs:
        a.copy_(b)
    return True


def _paired(a: Any, b: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether `a` and `b` have one structure, their tensors appended to `pairs`. A function of the module, not one
    nested in `_copy_into`: a nested function that calls itself is a reference cycle, which kept every timed call's
    outputs alive until Python's next collection, so the next timed calls took new memory from the driver inside
    their timings (docs/performance.md)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        pairs.append((a, b))
        return (type(a) is torch.Tensor and type(b) is torch.Tensor and a.shape == b.shape and a.dtype == b.dtype
                and a.device == b.device)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_paired(x, y, pairs) for x, y in zip(a, b))
    return a is b or (type(a) is type(b) and isinstance(a, (bool, int, float, str)) and a == b)


def serve(conn: Channel, scratch: Path, device: torch.device, gate_hooks: bool,
          confinement: dict[str, str] | None = None) -> None:
    Subject(conn, scratch, device, gate_hooks, confinement).serve()


def _hide_harness() -> None:
    """Take the harness's modules out of `sys.modules`: the harness keeps its own references, and a candidate that
    imports them by name gets fresh copies whose patching changes nothing here."""
    for name in [n for n in sys.modules if n == "drkernel" or n.startswith("drkernel.")]:
        del sys.modules[name]
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) and main.__spec__.name.startswith("drkernel."):
        sys.modules["__main__"] = types.ModuleType("__main__")


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


def _own_names(recorded: list[launches.Launch]) -> Counter[str]:
    return Counter(launch.name for launch in recorded if launch.own)


def _submodules(model: Any) -> list[Any]:
    return list(model.modules()) if isinstance(model, torch.nn.Module) else [model]


def _model_tensors(model: Any) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    for module in _submodules(model):
        tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
        if isinstance(module, torch.nn.Module):
            tensors += list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return tensors
