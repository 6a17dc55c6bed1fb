"""The judge: one evaluation's trusted side, a process in which no candidate code ever runs.

It loads the reference, draws every input from seeds only it knows, computes and times the reference, and asks the
subject (drkernel.sandbox.subject, the candidate's process) for calls on copies of those inputs. It compares the
candidate's outputs itself, measures their precision against a float64 evaluation of the reference, checks the
subject's timings against the wall time it observed, and decides the verdict, which only it can report (on a pipe to
the fork server that the subject never holds). Hooks, torch-function and dispatch modes, dispatcher registrations or
patches the candidate installs live in the subject's interpreter: none of them can touch the reference, the
comparison or the verdict.

Phases hand each other plain data: `load_reference` -> `Reference`; `load_candidate`; `check_correctness` ->
`CorrectnessReport`; `measure` -> `Measurement`; `profile`; `ablate`; `verdict.decide` turns them into the result.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import math
import os
import platform
import random
import re
import secrets
import signal
import statistics
import sys
import time
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch
import triton

from drkernel.sandbox import channel, correctness, guards, loading, profiling, timing, verdict
from drkernel.sandbox.channel import Channel, ChannelClosed, Encoder
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.subject import MODES, seeded, trimmed_traceback
from drkernel.schema import (
    Correctness, Environment, EvalOptions, EvalRequest, EvalResult, KernelTime, Precision, Profile, Status, Timing,
)

T = TypeVar("T")

CHECKED_TIMING_TRIALS = 1  # timed calls, chosen at random, whose outputs are compared in full (all: on a sample)
TIMED_SAMPLE_ELEMENTS = 4096  # elements per output compared after every other timed call
# The judge's wall-clock view of a timed call (less the null calls') may exceed the subject's event timing by this
# much before the timing is not believed: a factor for work outside the events, a margin for the host's noise.
WALL_FACTOR, WALL_MARGIN_MS = 1.5, 1.0
SHARE_OF_MEMORY = 0.25  # of the GPU's memory, at most, for one evaluation's trials beside others' (3 at once)
# Of the GPU's memory, at most, for a large evaluation's float64 precision trial: its inputs and the reference's
# outputs already hold several GiB, and a slice of the batch's rows measures the same rule (the judge of a 6 GiB
# problem held 44-46 GiB in its correctness phase on an H100 at SHARE_OF_MEMORY, 22.9 at 1/16; docs/benchmarks.md).
LARGE_PRECISION_SHARE = 1 / 64
# A large evaluation's correctness phase, both processes, measured on an H100 (docs/benchmarks.md, the twenty-second
# session): 3 x its inputs (the judge's, their shared copy, the subject's), 2 x the outputs (the reference's, the
# candidate's), the float64 allowance and at most this much more.
LARGE_PHASE_HEADROOM = 1.5 * 2**30
PAIR_SHARE_OF_MEMORY = 0.42  # of the GPU's memory, at most, for each of two large evaluations' phases at once
DEGENERACY_SAMPLE = 1 << 20  # elements of the reference's output kept to judge whether the task is degenerate
STDERR_TAIL = 3000
STDERR_CAUSE = re.compile(  # lines worth keeping: C++ and CUDA errors, Python's, the C library's heap checks
    r"terminate called|what\(\):|CUDA error|\w+Error\b:|Assertion|(?:malloc|free)\(\)|corrupted")
STDERR_CAUSE_LINES = 6
ABORT_HINT = ("; most often a kernel that loaded or stored outside its tensors (on the GPU an illegal memory access, "
              "a CUDA error raised where it cannot be caught; on the CPU a corrupted heap): check each store's size "
              "against its output")
PROFILED_CALLS = 3  # profiled forwards, each on inputs of its own
KEEP_CACHED_BYTES = 1 << 30  # what a process of an ordinary evaluation keeps cached from one phase to the next
PROFILE_SHARE_OF_MEMORY = 0.5  # the profile holds the GPU alone, but other evaluations' processes keep their memory
STOP_WAIT_S = 2.0  # how long the judge waits to learn how the subject ended
# The timing phase's parts in `phases_s` (as timing_<part>): the timer and the buffers shared for the phase, filling
# the inputs, the warm-up calls, the reference's timed calls, the candidate's (requests included), the null calls,
# comparing outputs, the checks on the timing, both sides letting the phase's buffers go.
TIMING_PARTS = ("stage", "refill", "warmup", "reference", "candidate", "null", "verify", "checks", "release")


class Failure(Exception):
    """Ends the evaluation with a verdict other than correct."""

    def __init__(self, status: Status, kind: str, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.tb = status, kind, message, tb


# -- the subject, seen from the judge ------------------------------------------------------------------------------


class SharedCopies:
    """Where the judge puts what it shares with the subject on a GPU: a memory pool of its own, holding nothing but
    these copies. CUDA IPC hands the subject the whole allocation a shared tensor lies in, and a candidate that keeps
    a mapping (a torch-function mode sees the subject's own calls on it) can write anywhere in it: beside a shared
    input in the judge's ordinary memory lay the reference's outputs for that input, computed just before
    (`tests/exploits/l9_*`). Nothing the judge computes with is ever in this pool, so whatever the subject writes
    there reaches only values the judge has already let go of."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool: Any = None  # torch.cuda.MemPool, made at the first share after each release

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.pool is None:
            self.pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(self.pool, self.device):
            return tensor.clone(memory_format=torch.contiguous_format)

    def release(self) -> None:
        """Let the pool's memory go once the subject has let its mappings go: a pool's cached memory is given back
        only when the pool itself goes (`torch.cuda.empty_cache` leaves it), so the pool goes and a new one comes."""
        torch.cuda.ipc_collect()
        self.pool = None


class SubjectLink:
    """Requests to the subject process. Its replies are evidence: outputs to compare, timings to check, findings to
    add. If it dies or breaks the protocol, the evaluation fails with what the judge saw."""

    def __init__(self, conn: Channel, pid: int, scratch: Path, device: torch.device, findings: guards.Findings,
                 gate: DeviceGate | None) -> None:
        self.conn, self.pid, self.scratch, self.device = conn, pid, scratch, device
        self.findings, self.gate = findings, gate
        self.shares = SharedCopies(device) if device.type == "cuda" else None
        # What the two processes cost beyond the work itself, in seconds: requests' round trips less the subject's
        # time in its handlers (the socket, encoding, mapping inputs), collecting shared blocks, mapping outputs.
        self.costs = {"handover": 0.0, "ipc_collect": 0.0, "map_outputs": 0.0}
        self.peak_bytes = 0  # the most the subject's allocator held in a request since this was last set to 0
        self._last_outputs: Any = None  # the outputs mapped last, kept open until the next are (see `values`)
        self.death: Failure | None = None  # how the subject ended, once the judge has seen it
        self.reaped: int | None = None  # its wait status, once the judge has reaped it

    def ask(self, op: str, values: dict[str, Any] | None = None, **fields: Any) -> tuple[dict[str, Any], list]:
        """The subject's reply to a request. `values` is emptied once encoded: where the caller keeps nothing else
        of them, only the subject's copy lives through its work (the encoder's shared copies on a GPU, bytes on the
        CPU)."""
        self._collect()
        start = time.perf_counter()
        encoder = self._encoder()
        header = {"op": op, **fields, **{k: encoder.encode(v) for k, v in (values or {}).items()}}
        if values:
            _sync_for(self.device)()  # the values (and their shared copies) are written before the subject reads them
            values.clear()
        try:
            self.conn.send(header, encoder.payloads)
            reply, payloads = self._reply()
        except (ChannelClosed, channel.BadMessage) as exc:
            raise self._died(exc) from None
        self._account(start, reply)
        self._take_findings(reply)
        del encoder  # the subject has copied the inputs
        return reply, payloads

    def _encoder(self) -> Encoder:
        return Encoder(self.shares.copy if self.shares is not None else None)

    def _take_findings(self, reply: dict[str, Any]) -> None:
        """Add what the subject's checks found (known reason codes only); raise its classified failure, if any."""
        found = reply.get("findings")
        for code, message in (found.items() if isinstance(found, dict) else ()):
            if code in guards.REASON_CODES:
                self.findings.add(code, str(message)[:2000])
        failure = reply.get("failure")
        if isinstance(failure, dict):
            known = failure.get("status") in {s.value for s in Status}
            status = Status(failure["status"]) if known else Status.RUNTIME_ERROR
            raise Failure(status, str(failure.get("kind", "Error"))[:100], str(failure.get("message", ""))[:4000],
                          str(failure.get("traceback", ""))[:8000])

    def ask_timed(self, values: dict[str, Any], **fields: Any) -> tuple[dict[str, Any], list, float]:
        """A timed call: the reply, its payloads, and the judge's wall-clock milliseconds from the request until the
        subject said the call was over (before it handed the outputs over)."""
        self._collect()
        encoder = self._encoder()
        header = {"op": "time", **fields, **{k: encoder.encode(v) for k, v in values.items()}}
        if values:
            _sync_for(self.device)()
        start = time.perf_counter()
        try:
            self.conn.send(header, encoder.payloads)
            first, _ = self._reply()
            wall = (time.perf_counter() - start) * 1e3
            if first.get("timed") is True:
                reply, payloads = self._reply()
            elif "failure" in first:  # the call raised: its classified failure comes instead
                reply, payloads = first, []
            else:
                raise channel.BadMessage("a timed call's reply came without its end signal")
        except (ChannelClosed, channel.BadMessage) as exc:
            raise self._died(exc) from None
        self._account(start, reply)
        self._take_findings(reply)
        return reply, payloads, wall

    def _account(self, start: float, reply: dict[str, Any]) -> None:
        """What a reply says of the subject's costs: its time in the handler (the rest of the round trip is the
        hand-over's) and the most memory it held (a diagnostic; a subject that lies about it only hides itself)."""
        busy = reply.get("busy_s")
        busy = float(busy) if isinstance(busy, (int, float)) and math.isfinite(busy) else 0.0
        self.costs["handover"] += max(0.0, time.perf_counter() - start - busy)
        peak = reply.get("peak_bytes")
        if type(peak) is int and 0 <= peak < 1 << 50:
            self.peak_bytes = max(self.peak_bytes, peak)

    def _collect(self) -> None:
        """Free what the judge shared earlier and the subject has let go of (CUDA frees shared blocks only here)."""
        if self.device.type == "cuda":
            start = time.perf_counter()
            torch.cuda.ipc_collect()
            self.costs["ipc_collect"] += time.perf_counter() - start

    def values(self, reply: dict[str, Any], payloads: list, key: str) -> Any:
        """The values a reply describes. On a GPU the last ones stay mapped until these are: the subject's next
        outputs mostly lie in the same allocation, which is then found open instead of opened and closed again
        (both are calls that take the driver's lock for the whole host)."""
        start = time.perf_counter()
        try:
            values = channel.decode(reply[key], payloads, self.device)
        except (KeyError, channel.BadMessage) as exc:
            raise Failure(Status.CRASHED, "BadReply", f"the candidate's process sent a malformed answer: {exc}")
        finally:
            self.costs["map_outputs"] += time.perf_counter() - start
        self._last_outputs = values
        return values

    def forget_outputs(self) -> None:
        """Let the last mapping go (the end of a phase: the subject may give its memory back)."""
        self._last_outputs = None

    def _reply(self) -> tuple[dict[str, Any], list]:
        """The reply, letting the GPU's gate go while the subject's Triton compiles a kernel."""
        while True:
            reply, payloads = self.conn.receive()
            stage = reply.get("compile")
            if stage is None:
                return reply, payloads
            if self.gate is not None and stage == "start":
                self.gate.pause(_sync_for(self.device))
            elif stage == "end":
                if self.gate is not None:
                    self.gate.resume()
                self.conn.send({"resume": True})

    def _died(self, exc: Exception) -> Failure:
        """The subject closed the connection, died or spoke nonsense: classify from how its process ended. Asked
        again (a phase's clean-up asks a subject already gone), the first classification stands: its process is
        reaped by then, and an unknown end would read as an exit the candidate called."""
        if self.death is None:
            self.death = self._classify_death(exc)
        return self.death

    def named_outputs(self, failure: Failure, ref_out: Any) -> Failure:
        """A call that killed the subject (most often a store outside an output the candidate allocated too small),
        with what the reference returns for the same inputs, computed before the call: what to size the outputs to.
        It stands as the subject's end for whatever asks later."""
        if failure.status is not Status.CRASHED or failure.kind != "Signal":
            return failure
        self.death = Failure(failure.status, failure.kind,
                             f"{failure.message}; for these inputs the reference returns {_described(ref_out)}",
                             failure.tb)
        return self.death

    def _classify_death(self, exc: Exception) -> Failure:
        status = self.stop()
        tail, causes = _stderr(self.scratch / "stderr.txt")
        if isinstance(exc, channel.BadMessage):
            return Failure(Status.CRASHED, "BadReply", f"the candidate's process broke the protocol: {exc}", tail)
        if status is not None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            hint = ABORT_HINT if sig == signal.SIGABRT else ""
            said = f"; it printed: {' / '.join(causes[:2])}" if causes else ""
            return Failure(Status.CRASHED, "Signal",
                           f"the evaluation process was killed by {name} ({signal.strsignal(sig)}){hint}{said}", tail)
        code = os.WEXITSTATUS(status) if status is not None else None
        self.findings.add(guards.EXIT_CALLED, "the candidate ended its process (os._exit or similar): a failure.")
        return Failure(Status.CRASHED, "Exit",
                       f"the evaluation process exited with code {code} before it answered", tail)

    def stop(self, wait: bool = True) -> int | None:
        """End the subject (whatever it is doing) and return its wait status, None if it is not known in time (or not
        waited for: a subject that answered to the end need not be seen to die before the verdict goes out; its
        CUDA context takes about 0.1 s to go). Where Landlock scopes signals, the judge cannot signal the subject's
        domain: the subject then ends with the judge (its parent-death signal, the PID namespace, the supervisor's
        kill of the process group). Once reaped, it is not signalled again (its PID may be another's by then)."""
        self.conn.sock.close()
        if self.reaped is not None:
            return self.reaped
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if not wait:
            return None
        deadline = time.monotonic() + STOP_WAIT_S
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                self.reaped = status
                return status
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)


class TimedCalls:
    """The timed calls' hand-over to the subject, for one timing phase (a context manager).

    On a GPU the inputs and outputs cross through buffers of the subject's, shared once for the phase (mapping another
    process's CUDA memory costs about a millisecond per tensor and direction, more beside other evaluations'
    mappings). The judge writes every call's fresh values into the subject's input buffers (one copy a call, no
    staging copy on either side) and never reads them back; the subject copies the outputs into its output buffers,
    made from the warm-up's outputs and shared with its reply (outputs over `subject.STAGED_BYTES`, or not all on the
    GPU, are sent call by call). Both sides synchronise their device before the other reads: nothing rests on CUDA's
    inter-process events. On the CPU every call's tensors travel as bytes."""

    def __init__(self, link: SubjectLink, template: list[Any],
                 part: Callable[[str], contextlib.AbstractContextManager[None]], give_back: Callable[[], bool]) -> None:
        self.link, self.template = link, template
        self.part = part  # counts the time of the phase's parts by name: here "stage" and "release"
        self.give_back = give_back  # asked at the end: whether the subject gives its cached memory back too
        self.staged = link.device.type == "cuda"
        self.inputs: list[Any] = []  # staged: the subject's input buffers, as mapped here; else the next call's values
        self.outputs: Any = None  # staged: the subject's output buffers, as mapped here

    def __enter__(self) -> TimedCalls:
        if self.staged:
            with self.part("stage"):
                reply, payloads = self.link.ask("stage", {"inputs": self.template})  # (ask waits for the device)
                self.inputs = self.link.values(reply, payloads, "inputs")
            if not _like(self.inputs, self.template):
                raise Failure(Status.CRASHED, "BadReply",
                              "the candidate's process shared input buffers unlike the values they stand for")
        return self

    def __exit__(self, *exc: Any) -> None:
        """Both sides let the phase's buffers go before the next phase (a profile of a large problem needs the
        memory, given back as `give_back` says); a subject already gone holds nothing."""
        staged, self.inputs, self.outputs = self.staged, [], None
        if staged and exc[0] is None:
            with self.part("release"):
                self.link.ask("release", give_back=self.give_back())

    def load(self, fresh: list[Any]) -> None:
        """The next call's input values (the caller synchronises the device before the call)."""
        if not self.staged:
            self.inputs = list(fresh)
            return
        for buffer, value in zip(self.inputs, fresh):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)

    def warm(self) -> dict[str, Any]:
        """An untimed call; staged, the subject makes its output buffers from its outputs and shares them here."""
        values, fields = self._request()
        reply, payloads = self.link.ask("warm", values, **fields)
        if reply.get("staging") is True:
            self.outputs = self.link.values(reply, payloads, "outputs")
        return reply

    def timed(self, spin_ms: float, null: bool = False) -> tuple[dict[str, Any], float, Any]:
        """(the subject's reply, the judge's wall-clock milliseconds for the call, its outputs: None for a null call)
        for one timed call, or the null call that calibrates the judge's wall clock (the same steps up to the call's
        end signal, around no call; nothing is handed over after it)."""
        values, fields = self._request()
        reply, payloads, wall = self.link.ask_timed(values, spin_ms=spin_ms, null=null, **fields)
        if null:
            return reply, wall, None
        if self.staged and reply.get("outputs_staged") is True and self.outputs is not None:
            return reply, wall, self.outputs  # the subject wrote this call's outputs into them
        outputs = self.link.values(reply, payloads, "outputs")
        if reply.get("staging") is True:  # the subject's output buffers, shared anew
            self.outputs = outputs
        return reply, wall, outputs

    def _request(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return ({}, {"staged": True}) if self.staged else ({"inputs": self.inputs}, {})


# -- phase data --------------------------------------------------------------------------------------------------


@dataclass
class Reference:
    """The reference, loaded and built in the judge: what every phase computes the expected answers with."""

    model: torch.nn.Module
    call: Callable[..., Any]
    get_inputs: Callable[[], Any]
    init_inputs: list[Any]
    device: torch.device
    sizes: tuple[int | None, int | None] = (None, None)  # bytes of its inputs and outputs (`sizes_on_meta`)
    _exact: torch.nn.Module | None = None  # the float64 copy, made when first needed

    def inputs(self, seed: int) -> list[Any]:
        try:
            values = seeded(seed, self.device, self.get_inputs)
        except BaseException as exc:
            raise Failure(Status.INVALID, "ReferenceError", f"get_inputs() failed: {exc}")
        return [v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values]

    def exact(self, inputs: list[Any], training: bool) -> Any:
        """The reference's outputs computed in float64 (parameters, buffers and floating inputs upcast)."""
        if self._exact is None:
            self._exact = copy.deepcopy(self.model).double()
        self._exact.train(training)
        upcast = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in inputs]
        return self._exact(*upcast)


@dataclass
class Exact:
    """A trial's float64 reference outputs, and the precision rule applied to the candidate's."""

    outputs: Any
    rows: slice | None = None  # the rows of the batch they stand for (None: all)

    def judge(self, ref_out: Any, cand_out: Any, opts: EvalOptions, findings: guards.Findings) -> Precision | None:
        if self.rows is not None:
            batch = correctness.flatten_outputs(ref_out)[0].shape[0]
            ref_out, cand_out = (correctness.rows_of(v, self.rows, batch) for v in (ref_out, cand_out))
        errors = correctness.errors_against(self.outputs, ref_out, cand_out)
        if errors is None:
            return None
        cand_err, ref_err, dtype = errors
        floor = torch.finfo(dtype).eps
        ratio = cand_err / max(ref_err, floor)
        if opts.precision == "matched" and ratio > opts.precision_factor:
            findings.add(
                guards.PRECISION_DOWNCAST,
                f"the outputs' error against a float64 evaluation is {cand_err:.2g}, {ratio:.0f}x the reference's own "
                f"({ref_err:.2g}; at most {opts.precision_factor:g}x allowed): about {correctness.bits(cand_err):.0f} "
                f"correct bits where {dtype} gives {correctness.bits(max(ref_err, floor)):.0f}, the error of "
                f"{correctness.arithmetic_like(cand_err)} arithmetic. Compute in the reference's precision (for "
                "tl.dot on float32, input_precision=\"ieee\"; no float16/bfloat16 casts).",
            )
        return Precision(rule=opts.precision, candidate_error=cand_err, reference_error=ref_err, ratio=ratio,
                         factor=opts.precision_factor)


@dataclass
class CorrectnessReport:
    correctness: Correctness
    launches_by_mode: dict[str, int] = field(default_factory=dict)
    own_counts: dict[str, int] = field(default_factory=dict)
    first_trial_s: float = 0.0


@dataclass
class Measurement:
    timing: Timing
    speedup: float
    interval: list[float]
    phases_s: dict[str, float]  # the timing phase's parts (TIMING_PARTS), seconds
    unsteady: list[str] = field(default_factory=list)  # a side whose median is a slow call (timing.unsteady)


# -- the evaluation ----------------------------------------------------------------------------------------------


class Judge:
    """One evaluation's phases, sharing the request, the device, the GPU's gate and the findings."""

    def __init__(self, request: EvalRequest, workdir: Path, device: torch.device, gate: DeviceGate | None,
                 link: SubjectLink) -> None:
        self.request, self.workdir, self.device, self.gate, self.link = request, workdir, device, gate, link
        self.findings = link.findings
        self.notes: list[str] = []
        self.large = False  # its trials take a large part of the GPU's memory (`memory_class`)
        self.pairs = False  # large, and its correctness phase fits beside one other large evaluation's
        self.report: CorrectnessReport | None = None  # kept when a trial fails: the result says how far it got
        self.memory_gib: dict[str, float] = {}  # "PHASE_judge", "PHASE_subject": see `_memory_of`
        self.result_environment: Environment | None = None  # where the subject's own confinement report goes
        self._rng = random.Random(secrets.randbits(64))  # trial seeds and checked calls: nobody else learns them

    @property
    def options(self) -> EvalOptions:
        return self.request.options

    @property
    def weighs_memory(self) -> bool:
        """Whether its GPU memory is weighed against other evaluations' (`check_memory_share`): on a GPU it shares."""
        return self.gate is not None and self.device.type == "cuda"

    def secret_seed(self) -> int:
        return self._rng.randrange(1 << 31)

    # -- set-up ----------------------------------------------------------------------------------------------

    def load_reference(self) -> Reference:
        try:
            module = loading.load_module(self.request.reference, self.workdir / "reference.py",
                                         f"drkernel_reference_{os.getpid()}")
            loading.require(module, ("Model", "get_inputs", "get_init_inputs"), "reference")
            init_inputs = list(seeded(self.options.seed, self.device, module.get_init_inputs))
            model = seeded(self.options.seed, self.device, lambda: module.Model(*init_inputs)).to(self.device)
        except BaseException as exc:
            raise Failure(Status.INVALID, "ReferenceError", f"the reference is unusable: {exc}",
                          trimmed_traceback(exc, self.workdir))
        call = torch.compile(model) if self.options.reference_mode == "compile" else model
        return Reference(model=model, call=call, get_inputs=module.get_inputs, init_inputs=init_inputs,
                         device=self.device, sizes=sizes_on_meta(module) if self.weighs_memory else (None, None))

    def check_memory_share(self, reference: Reference) -> None:
        """Several evaluations check correctness at once: one whose trials need more than a share of the GPU's memory
        is large (`memory_class`): it checks beside ordinary evaluations, beside one other large one only where both
        phases fit (`pairs`), and keeps the GPU while the subject compiles (its memory, held through a compilation,
        left no room for another's timing: out-of-memory failures measured on an H100)."""
        if not self.weighs_memory:
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        self.large, self.pairs = memory_class(*reference.sizes, total)

    def load_candidate(self, reference: Reference) -> None:
        reply, _ = self.link.ask("load", {"init_inputs": reference.init_inputs}, candidate=self.request.candidate,
                                 seed=self.options.seed, check_hacks=self.options.check_hacks,
                                 allow_torch_glue=self.options.allow_torch_glue)
        self.notes += [str(n)[:500] for n in reply.get("notes", [])][:20]
        layers = reply.get("confinement")  # the subject's word, shown as its own: it decides nothing
        if isinstance(layers, dict) and self.result_environment is not None:
            self.result_environment.confinement.update(
                {f"subject_{k}"[:40]: str(v)[:300] for k, v in list(layers.items())[:10]})

    # -- correctness -----------------------------------------------------------------------------------------

    def check_correctness(self, reference: Reference) -> CorrectnessReport:
        return self.beside_others("correctness", lambda alone: self._check_correctness(reference, alone))

    def beside_others(self, phase: str, work: Callable[[bool], T]) -> T:
        """`work(alone)`, a phase that shares the GPU (alone=False). Beside other evaluations, the GPU's memory running
        out may be their doing as much as the candidate's: then the phase runs again holding the GPU alone, and that
        attempt's verdict stands."""
        if self.gate is None:
            return work(False)
        kept = len(self.notes)
        try:
            return work(False)
        except (Failure, torch.OutOfMemoryError, torch.AcceleratorError) as exc:
            if not out_of_memory(exc):
                raise
            del self.notes[kept:]  # the second attempt says again what it finds
            self.notes.append(f"{phase}: the GPU's memory ran out beside other evaluations ("
                              f"{_failure_text(exc)[:200]}): run again alone")
        return work(True)

    def _check_correctness(self, reference: Reference, alone: bool) -> CorrectnessReport:
        opts = self.options
        trials = max(opts.correctness_trials, len(MODES) if opts.check_hacks else 0)
        report = self.report = CorrectnessReport(Correctness(trials=trials))
        precision_trial = self._rng.randrange(trials)
        ref_samples: list[torch.Tensor] = []
        started = time.perf_counter()
        # A large evaluation holds the GPU once for all its trials: both processes keep their memory from trial to
        # trial instead of giving back and allocating again several GB each, and no large evaluation's trials but a
        # paired one's come in between. Ordinary ones hold it trial by trial, letting others' timing in between; one
        # checked again alone holds it once, exclusively.
        checks = functools.partial(self.holding_gpu, "correctness", alone, self.pairs)
        whole, per_trial = (checks, contextlib.nullcontext) if self.large or alone else (contextlib.nullcontext, checks)
        with whole():
            for trial in range(trials):
                with per_trial():
                    self._correctness_trial(reference, trial, trial == precision_trial, report, ref_samples)
                if trial == 0:
                    report.first_trial_s = time.perf_counter() - started
        self._check_modes(report.launches_by_mode)
        if len(ref_samples) == 2:
            why = correctness.degeneracy(*ref_samples)
            if why:
                self.notes.append(f"degenerate_task: {why}")
        return report

    def _correctness_trial(self, reference: Reference, trial: int, with_precision: bool, report: CorrectnessReport,
                           ref_samples: list[torch.Tensor]) -> None:
        opts, summary = self.options, report.correctness
        label = list(MODES)[trial % len(MODES)]
        training, grad_mode = MODES[label]
        inputs = reference.inputs(self.secret_seed())
        reference.model.train(training)
        with grad_mode():
            ref_out = _detached(reference.call(*inputs))
        # Everything the judge needs of these inputs is computed before the subject sees them (on a GPU it maps them);
        # then they go, and only the subject's copy lives through its call and the comparison (`ask` empties `shared`).
        precision = self._precision(reference, inputs, ref_out, training, grad_mode) if with_precision else None
        shared = {"inputs": inputs}
        del inputs
        try:
            reply, payloads = self.link.ask("call", shared, mode=label, forget_inputs=self.large)
        except Failure as failure:
            raise self.link.named_outputs(failure, ref_out) from None
        cand_out = self.link.values(reply, payloads, "outputs")
        own = {str(k): int(v) for k, v in reply.get("own", {}).items() if isinstance(v, int)}
        report.launches_by_mode[label] = report.launches_by_mode.get(label, 0) + sum(own.values())
        for name, count in own.items():
            report.own_counts[name] = report.own_counts.get(name, 0) + count
        comparison = correctness.compare(ref_out, cand_out, trial, opts.atol, opts.rtol, opts.rel_error_bound)
        if comparison.tolerance is not None:
            summary.atol, summary.rtol = comparison.tolerance.atol, comparison.tolerance.rtol
            summary.rel_error_bound = comparison.tolerance.rel_error_bound
        summary.max_abs_diff = max(summary.max_abs_diff or 0.0, comparison.max_abs_diff)
        summary.rel_error = max(summary.rel_error or 0.0, comparison.rel_error)
        first_ref = correctness.flatten_outputs(ref_out)[0]
        if isinstance(first_ref, torch.Tensor) and len(ref_samples) < 2:
            # On the host: a 4 MiB block kept on the GPU for the phase would lie in a large trial's freed segment,
            # which then holds no full-size tensor again, and the next trial's would take a new one.
            ref_samples.append(first_ref.detach().reshape(-1)[:DEGENERACY_SAMPLE].to("cpu", copy=True))
        if not comparison.ok:
            summary.first_mismatch = comparison.mismatch
            self._note_dtype_cheat(ref_out, cand_out)
            raise Failure(Status.INCORRECT, "Mismatch", f"trial {trial} ({label}): {comparison.message}")
        if precision is not None:
            summary.precision = precision.judge(ref_out, cand_out, opts, self.findings)
        summary.passed_trials += 1
        if self.large:  # mapped until the next trial's came, they would make the subject put those beside them
            self.link.forget_outputs()

    def _precision(self, reference: Reference, inputs: list[Any], ref_out: Any, training: bool,
                   grad_mode: Callable[[], Any]) -> Exact | None:
        """The reference's outputs in float64 on a trial's inputs, or on a slice of their batch where all of them
        would need more than this evaluation's share of the GPU and the reference treats rows separately."""
        needed = 2 * sum(t.numel() * 8 for t in [*inputs, *correctness.flatten_outputs(ref_out)]
                         if isinstance(t, torch.Tensor) and t.is_floating_point())  # float64 copies, and headroom
        budget = precision_budget(torch.cuda.get_device_properties(self.device).total_memory, self.large) \
            if self.device.type == "cuda" else math.inf
        rows = None
        if needed > budget:
            rows = correctness.batch_rows(inputs, ref_out, budget / needed, self._rng.randrange)
            batch = next((t.shape[0] for t in inputs if isinstance(t, torch.Tensor)), 0)
            why = "its tensors have no batch dimension to take a slice of"
            if rows is not None:
                inputs = correctness.rows_of(inputs, rows, batch)
                checker = copy.deepcopy(reference.model).train(training)  # the reference's own state stays as it is
                with grad_mode():
                    separate = correctness.same_rows(checker(*inputs), ref_out, rows, batch)
                del checker
                why = "" if separate else "the reference does not treat the rows of its batch separately"
            if why:
                self.notes.append(f"precision: not measured, a float64 evaluation of the reference needs about "
                                  f"{needed / 2**30:.0f} GiB, more than this evaluation's share of the GPU, and {why}")
                return None
            self.notes.append(f"precision: measured on rows {rows.start}-{rows.stop - 1} of {batch} (a float64 "
                              f"evaluation of all of them needs about {needed / 2**30:.0f} GiB)")
        try:
            with grad_mode():
                return Exact(_detached(reference.exact(inputs, training)), rows)
        except Exception as exc:  # a reference that cannot run in float64: the rule cannot be applied
            self.notes.append(f"precision: not measured, the reference does not run in float64 ({exc})"[:300])
            return None

    def _note_dtype_cheat(self, ref_out: Any, cand_out: Any) -> None:
        for ref, cand in zip(correctness.flatten_outputs(ref_out), correctness.flatten_outputs(cand_out)):
            if isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor):
                if correctness.PRECISION_RANK.get(cand.dtype, 9) < correctness.PRECISION_RANK.get(ref.dtype, 0):
                    self.findings.add(
                        guards.LOWER_PRECISION,
                        f"an output is {cand.dtype} where the reference gives {ref.dtype}: computing in lower "
                        "precision is not the same function.",
                    )

    def _check_modes(self, launches_by_mode: dict[str, int]) -> None:
        if not self.options.check_hacks:
            return
        if sum(launches_by_mode.values()) == 0:
            self.findings.add(
                guards.NO_TRITON_KERNEL,
                "ModelNew ran no Triton kernel of its own: the work was done by PyTorch or another library. "
                "Implement the computation in @triton.jit kernels launched from forward.",
            )
            return
        missing = [label for label, n in launches_by_mode.items() if n == 0]
        if missing:
            self.findings.add(
                guards.MODE_DEPENDENT,
                f"ModelNew ran no Triton kernel in mode(s) {', '.join(missing)}: kernels must run whatever the "
                "training flag, autograd or inference mode.",
            )

    # -- timing ----------------------------------------------------------------------------------------------

    def measure(self, reference: Reference, report: CorrectnessReport) -> Measurement:
        """Both sides timed trial by trial, in alternating order, on values never seen before: the reference here, the
        candidate in its process (its event timing checked against the judge's wall clock), every candidate output
        compared on a sample, a few chosen calls in full.

        When the wall-clock check fires, or a side's median call is a slow one (above twice its fastest: a fifth of
        the candidates' in lease 10, beside other runs' evaluations), the whole measurement is made once
        more and only the second one counts, its timings and its check: a host that stalled some of the calls (a
        legitimate kernel was `side_stream_timing` on an H200 beside other runs' evaluations) gets a clean
        measurement, work hidden on another stream shows again, and a candidate that changes its behaviour for the
        second measurement is timed as it then behaves. A second one still unsteady says so in the notes."""
        spent = dict.fromkeys(TIMING_PARTS, 0.0)  # where the phase's time goes, in seconds, over both measurements
        measured, suspicions = self._measure_once(reference, report, spent)
        why = suspicions.get(guards.SIDE_STREAM) or "; ".join(measured.unsteady)
        if why:
            self.notes.append(f"timing measured again: in the first measurement {why}")
            measured, suspicions = self._measure_once(reference, report, spent)
            measured.timing.measurements = 2
        for reason, message in suspicions.items():
            self.findings.add(reason, message)
        self.notes += [f"timing: {text}: the speedup may be off (a busy host or GPU); timing.*.samples_ms holds every "
                       "call" for text in measured.unsteady]
        return measured

    def _measure_once(self, reference: Reference, report: CorrectnessReport,
                      spent: dict[str, float]) -> tuple[Measurement, dict[str, str]]:
        """One measurement, and the hack reasons its timings alone suggest (measure() decides what counts)."""
        opts = self.options
        reference.model.train(False)
        args = reference.inputs(self.secret_seed())  # the reference's inputs, new before every call
        checked = set(self._rng.sample(range(opts.perf_trials), min(CHECKED_TIMING_TRIALS, opts.perf_trials)))

        @contextmanager
        def part(name: str) -> Iterator[None]:
            start = time.perf_counter()
            yield
            spent[name] += time.perf_counter() - start

        def refill() -> None:
            """New values for both sides: the reference calls on them here, a copy goes into the subject's buffers
            (the candidate may write its inputs; the reference must not see that)."""
            with part("refill"):
                args.clear()  # the last values go before the new ones are made (but a small call's, kept by `placed`)
                args.extend(reference.inputs(self.secret_seed()))
                calls.load(args)
                _sync_for(self.device)()

        with part("stage"):
            timer = timing.CallTimer(self.device)
        host_ms: dict[str, list[float]] = {"reference": [], "candidate": []}
        calls = TimedCalls(self.link, args, part, self._gives_back)
        # No collection in this process while it times (its wall clock of the candidate's calls included).
        with timing.collector_paused(), torch.no_grad(), calls:
            for _ in range(max(1, opts.warmup_trials)):  # at least one: its host time sets the spin
                refill()
                with part("warmup"):
                    warm_out, warm_host_ms = timer.untimed(reference.call, args)
                    host_ms["reference"].append(warm_host_ms)
                    reply = calls.warm()
                    host_ms["candidate"].append(_positive(reply.get("host_ms", 0.0)))
            placed = timing.Placements.for_call(self.device, [args, warm_out])  # the subject places its own likewise
            placed.reserve([args, warm_out])
            del warm_out
            # Each side's spin outlasts its own enqueueing, as seen so far (not the first warm-up: it may compile);
            # the null calls spin as the candidate's calls do.
            spins: dict[str, list[float]] = {"reference": [], "candidate": []}
            ref, cand = timing.Samples(), timing.Samples()
            own_per_call: list[int] = []
            for trial in range(opts.perf_trials):
                for side, seen in host_ms.items():
                    spins[side].append(timing.cover_for(seen[1:] or seen))
                timer.cover_ms, cand_spin_ms = spins["reference"][-1], spins["candidate"][-1]
                refill()
                if trial % 2:  # the order alternates, so that drift hits both sides alike
                    with part("candidate"):
                        reply, wall, cand_out = calls.timed(cand_spin_ms)
                    with part("reference"):
                        ref_out, ref_ms, ref_host_ms = timer.timed(reference.call, args)
                else:
                    with part("reference"):
                        ref_out, ref_ms, ref_host_ms = timer.timed(reference.call, args)
                    with part("candidate"):
                        reply, wall, cand_out = calls.timed(cand_spin_ms)
                host_ms["reference"].append(ref_host_ms)
                host_ms["candidate"].append(_positive(reply.get("host_ms")))
                ref.host_ms.append(ref_host_ms)
                cand.host_ms.append(host_ms["candidate"][-1])
                ref.interruptions.append(list(timer.interruptions))
                cand.interruptions.append(_counts(reply.get("host_interruptions")))
                if self.device.type == "cuda":
                    ref.driver_allocations.append(timer.driver_allocations)
                    cand.driver_allocations.append(_count(reply.get("driver_allocations")))
                ref.event_ms.append(ref_ms)
                cand.event_ms.append(_positive(reply.get("event_ms")))
                # A null call right after (the same steps and hand-over around no call): what the wall clock sees
                # beyond the call itself, under the host's load of the moment.
                with part("null"):
                    null_wall = calls.timed(cand_spin_ms, null=True)[1]
                cand.wall_ms.append(max(0.0, wall - null_wall))
                own_per_call.append(int(reply.get("own", 0)))
                with part("verify"):
                    self._verify_timed(trial, trial in checked, ref_out, cand_out)
                placed.keep(list(args), ref_out)
                del ref_out, cand_out
        if timer.l2_tampered:
            self.findings.add(guards.L2_PERSISTENCE, "persisting-L2 settings changed while the reference was timed: "
                              "the candidate's process set them.")
        if opts.check_hacks and own_per_call and min(own_per_call) == 0 and sum(report.launches_by_mode.values()):
            self.findings.add(guards.MODE_DEPENDENT,
                              "some timed calls ran no Triton kernel: the candidate changes behaviour between calls.")
        method = "cuda_event" if self.device.type == "cuda" else ("interpreter_wall" if interpreting() else "cpu_wall")
        result = Timing(reference=timing.summarize(ref, method, statistics.median(spins["reference"])),
                        candidate=timing.summarize(cand, method, statistics.median(spins["candidate"])),
                        reference_mode=opts.reference_mode)
        if method == "interpreter_wall":
            result.note = "Triton interpreter on the CPU: these timings say nothing of GPU speed"
        suspicions: dict[str, str] = {}
        if self.device.type == "cuda":
            with part("checks"):
                assert result.candidate is not None
                excess = wall_clock_excess(result.candidate.median_ms, statistics.median(cand.wall_ms))
                if excess is not None:
                    suspicions[guards.SIDE_STREAM] = (f"{excess}: work ran outside the timed stream, or the timing "
                                                      "was tampered with. Launch kernels on the current stream.")
                too_fast = self._too_fast(result.candidate.median_ms, args, reference)
                if too_fast is not None:
                    suspicions[guards.IMPOSSIBLE_SPEED] = too_fast
        speedup = result.reference.median_ms / max(result.candidate.median_ms, 1e-9)  # type: ignore[union-attr]
        unsteady = [text for side, samples in (("reference", ref), ("candidate", cand))  # CPU wall times say nothing
                    if method == "cuda_event" and (text := timing.unsteady(side, samples, spins[side]))]
        return Measurement(result, speedup, timing.speedup_interval(ref.primary, cand.primary, opts.seed),
                           {f"timing_{name}": seconds for name, seconds in spent.items()}, unsteady), suspicions

    def _verify_timed(self, trial: int, full: bool, ref_out: Any, cand_out: Any, call: str = "a timed call") -> None:
        """A timed (or profiled) call's outputs: a remembered answer differs almost everywhere from the one for new
        values."""
        opts = self.options
        if full:
            compared = correctness.compare(ref_out, cand_out, trial, opts.atol, opts.rtol, opts.rel_error_bound)
        else:
            generator = torch.Generator(device=self.device).manual_seed(self._rng.randrange(1 << 62))
            compared = correctness.compare_sample(ref_out, cand_out, trial, opts.atol, opts.rtol,
                                                  opts.rel_error_bound, TIMED_SAMPLE_ELEMENTS, generator)
        if not compared.ok:
            self.findings.add(
                guards.OUTPUT_CACHING,
                f"{call} returned a wrong answer for new input values ({compared.message}): outputs must be "
                "computed on every call, never cached or remembered. An answer right in the correctness trials and "
                "wrong here can also come from loads or stores outside a tensor, which read memory that held the "
                "right values only by chance: check each pointer's offsets against the shape of the tensor it points "
                "into.",
            )

    def _too_fast(self, median_ms: float, args: list[Any], reference: Reference) -> str | None:
        """The candidate's timed calls against the bytes its outputs must be written in, at the GPU's bandwidth."""
        with torch.no_grad():
            out = reference.call(*args)
        out_bytes = correctness.tensor_bytes(out)
        floor_ms = out_bytes / timing.measure_bandwidth(self.device) * 1e3
        if median_ms >= 0.5 * floor_ms:
            return None
        return (f"{median_ms:.4f} ms is faster than writing the {out_bytes} output bytes allows on this GPU "
                f"({floor_ms:.4f} ms at its measured bandwidth).")

    # -- profile and ablation --------------------------------------------------------------------------------

    def profile(self, reference: Reference, report: CorrectnessReport) -> Profile:
        """Coverage from a call on fresh inputs whose output the judge checks."""
        if self.device.type != "cuda":
            return Profile(launches=dict(report.own_counts), note="no GPU: launch counts only, coverage not measured")
        reference.model.train(False)
        sets = [reference.inputs(self.secret_seed())]  # the warm-up's, then one set per profiled call
        ref_outs: list[Any] = []
        with torch.no_grad():
            while len(ref_outs) < self._profiled_calls(sets[0], ref_outs[:1]):
                sets.append(reference.inputs(self.secret_seed()))
                ref_outs.append(reference.call(*sets[-1]))
        reply, payloads = self.link.ask("profile", {"inputs": sets}, own_names=sorted(report.own_counts))
        cand_outs = self.link.values(reply, payloads, "outputs")
        if not isinstance(cand_outs, list) or len(cand_outs) != len(ref_outs):
            raise Failure(Status.CRASHED, "BadReply", "the candidate's process sent the wrong number of outputs")
        for ref_out, cand_out in zip(ref_outs, cand_outs):
            self._verify_timed(-1, True, ref_out, cand_out, call="a profiled call")
        result = _profile_from(reply.get("profile"))
        result.launches = dict(report.own_counts)
        lazy = result.coverage is not None and result.coverage < self.options.min_coverage
        if self.options.check_hacks and lazy and guards.NO_TRITON_KERNEL not in self.findings.details:
            self.findings.add(
                guards.LAZY_KERNEL,
                f"only {result.coverage:.1%} of the GPU time is spent in the candidate's own Triton kernels "
                f"(at least {self.options.min_coverage:.0%} required): PyTorch does the work. Move the "
                "computation into the kernels.",
            )
        return result

    def _profiled_calls(self, inputs: list[Any], outputs: list[Any]) -> int:
        """PROFILED_CALLS, or fewer (at least one) where their memory would pass PROFILE_SHARE_OF_MEMORY of the GPU's:
        each holds an input set in both processes and three outputs (the reference's, the candidate's and its copy);
        the warm-up two input sets. Problems with 6.4 GB inputs ran out of memory with three calls on an H100."""
        if not outputs:  # the first profiled call is made in any case; its output's size is known after it
            return 1
        size_in, size_out = correctness.tensor_bytes(inputs), correctness.tensor_bytes(outputs[0])
        budget = torch.cuda.get_device_properties(self.device).total_memory * PROFILE_SHARE_OF_MEMORY
        fits = int((budget - 2 * size_in) // max(1, 2 * size_in + 3 * size_out))
        return max(1, min(PROFILED_CALLS, fits))

    def ablate(self, reference: Reference, alone: bool) -> None:
        """In every mode, on fresh inputs: where poisoning what the own kernels wrote leaves the output unchanged, they
        were decoys. Beside others' checks, or `alone`; a large evaluation's beside another large one's where its
        correctness phase may be (`pairs`): the subject holds at most two inputs and an output or an input and two
        outputs at once, the judge two inputs (its own, the shared copy), fewer than the correctness phase's account."""
        with self.holding_gpu("ablation", alone, self.pairs):
            self._ablate(reference)

    def _ablate(self, reference: Reference) -> None:
        for label in MODES:
            reply, payloads = self.link.ask("ablate", {"inputs": reference.inputs(self.secret_seed())}, mode=label,
                                            forget_inputs=self.large)
            normal = self.link.values(reply, payloads, "normal")
            ablated = self.link.values(reply, payloads, "ablated")
            decoys = reply.get("ran") is True and len(normal) == len(ablated) and all(
                _identical(a, b) for a, b in zip(normal, ablated))
            if self.large:  # mapped into the next mode's, the subject could not free them: 12 of its 36 GiB there
                del normal, ablated
                self.link.forget_outputs()
            if reply.get("repeat_differs") is True and self.options.check_hacks:
                self.findings.add(
                    guards.OUTPUT_CACHING,
                    "called again on inputs holding the same values, forward launched other kernels than the first "
                    "time: it answers values it has seen from memory. Compute the outputs on every call.",
                )
            if decoys:
                self.findings.add(
                    guards.DECOY_KERNEL,
                    f"in mode {label} the output does not depend on anything the candidate's Triton kernels "
                    "computed: they are decoys, and the result comes from other code.",
                )
                return

    # -- the GPU's gate --------------------------------------------------------------------------------------

    def sharing_gpu(self, phase: str, paired: bool = False) -> contextlib.AbstractContextManager[None]:
        """Work that may run beside other evaluations' correctness checks, never beside their timing; a large
        evaluation's beside another large one's only where `paired`."""
        return self._gated(phase, lambda gate: gate.large(paired) if self.large else gate.shared())

    def holding_gpu(self, phase: str, alone: bool, paired: bool = False) -> contextlib.AbstractContextManager[None]:
        """A phase that shares the GPU (`sharing_gpu`), or holds it `alone` when run again (`beside_others`)."""
        return self.owning_gpu(phase) if alone else self.sharing_gpu(phase, paired)

    def owning_gpu(self, phase: str) -> contextlib.AbstractContextManager[None]:
        """Timing and profiling: no other evaluation's kernels run meanwhile."""
        return self._gated(phase, lambda gate: gate.exclusive())

    @contextmanager
    def _gated(self, phase: str, hold: Callable[[DeviceGate], Any]) -> Iterator[None]:
        """Hold the GPU's gate (nothing to hold when the evaluation has its device to itself); on the way out, both
        processes let the phase's buffers go, and give back the memory they cached if it is much (`gives_back`)."""
        with self._memory_of(phase):
            if self.gate is None:
                yield
                return
            with hold(self.gate):
                try:
                    yield
                finally:
                    if self.device.type == "cuda":
                        give_back = self._gives_back()
                        self.link.forget_outputs()
                        with contextlib.suppress(Failure):  # a subject already gone holds nothing
                            self.link.ask("release", give_back=give_back)
                        if give_back:
                            if self.link.shares is not None:
                                self.link.shares.release()
                            torch.cuda.empty_cache()

    def _gives_back(self) -> bool:
        return gives_back(self.large, torch.cuda.memory_reserved(self.device), self.link.peak_bytes)

    @contextmanager
    def _memory_of(self, phase: str) -> Iterator[None]:
        """The most GPU memory each process's allocator held in the phase (over all its holds): whether two
        evaluations' phases fit beside each other is read from these."""
        if self.device.type != "cuda":
            yield
            return
        torch.cuda.reset_peak_memory_stats(self.device)
        self.link.peak_bytes = 0
        try:
            yield
        finally:
            for side, peak in (("judge", torch.cuda.max_memory_reserved(self.device)),
                               ("subject", self.link.peak_bytes)):
                key = f"{phase}_{side}"
                self.memory_gib[key] = max(self.memory_gib.get(key, 0.0), round(peak / 2**30, 3))


def gives_back(large: bool, judge_bytes: int, subject_bytes: int) -> bool:
    """Whether both processes give their cached GPU memory back to the driver at the end of a phase: a large
    evaluation does, and one whose processes hold more than KEEP_CACHED_BYTES (the others' phases need the room). An
    ordinary one keeps it: giving back and allocating again, phase after phase, are calls that take the driver's
    lock for the whole host (`rmapiLockAcquire`), where the threads of several GPUs' evaluations were found waiting
    (docs/benchmarks.md, "Where the host waits")."""
    return large or max(judge_bytes, subject_bytes) > KEEP_CACHED_BYTES


def memory_class(inputs: int | None, outputs: int | None, total_memory: int) -> tuple[bool, bool]:
    """Whether an evaluation with `inputs` and `outputs` bytes (None: unknown) is large on a GPU of `total_memory`
    bytes (its trials' five copies of the inputs would pass SHARE_OF_MEMORY; unknown inputs count as large), and
    whether, large, its correctness phase as measured (LARGE_PHASE_HEADROOM) fits PAIR_SHARE_OF_MEMORY (unknown sizes
    do not: they would risk the other one's memory)."""
    large = inputs is None or 5 * inputs > SHARE_OF_MEMORY * total_memory
    if not large or inputs is None or outputs is None:
        return large, False
    phase = 3 * inputs + 2 * outputs + precision_budget(total_memory, True) + LARGE_PHASE_HEADROOM
    return True, phase <= PAIR_SHARE_OF_MEMORY * total_memory


def out_of_memory(exc: BaseException) -> bool:
    """Whether a failure is the GPU's memory running out (an allocation of the candidate's or the judge's, a mapping):
    torch's error, or a failure whose message says so (the subject's, the reference's inputs)."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in _failure_text(exc).lower()


def _failure_text(exc: BaseException) -> str:
    """What a failure says: a Failure's message, any other exception's text."""
    return exc.message if isinstance(exc, Failure) else str(exc)


def precision_budget(total_memory: int, large: bool) -> float:
    """The bytes a precision trial's float64 evaluation may take on a GPU of `total_memory` bytes: SHARE_OF_MEMORY of
    it, LARGE_PRECISION_SHARE for a large evaluation (beyond it, a slice of the batch)."""
    return (LARGE_PRECISION_SHARE if large else SHARE_OF_MEMORY) * total_memory


def evaluate(request: EvalRequest, workdir: Path, device: torch.device, gate: DeviceGate | None,
             link: SubjectLink) -> EvalResult:
    """Run one evaluation and return its result; never raises for anything the candidate does."""
    judge = Judge(request, workdir, device, gate, link)
    opts = request.options
    if opts.reference_mode != "compile":
        call_dynamo_disabled_directly()
    result = EvalResult(environment=environment(device))
    judge.result_environment = result.environment
    failure: Failure | None = None
    try:
        with judge.sharing_gpu("reference"):
            reference = _timed(result, "reference", judge.load_reference)
        judge.check_memory_share(reference)
        with judge.sharing_gpu("load"):
            _timed(result, "load", lambda: judge.load_candidate(reference))
        report = _timed(result, "correctness", lambda: judge.check_correctness(reference))
        result.phases_s["correctness_first_trial"] = round(report.first_trial_s, 4)  # Triton compiles here
        if opts.measure_performance or opts.profile:
            waited = time.perf_counter()
            with judge.owning_gpu("timing"):  # and the profile
                result.phases_s["gpu_wait"] = round(time.perf_counter() - waited, 4)  # others' timing, checks
                if opts.measure_performance:
                    measured = _timed(result, "timing", lambda: judge.measure(reference, report))
                    result.timing, result.speedup, result.speedup_ci = (
                        measured.timing, measured.speedup, measured.interval)
                    result.phases_s.update({k: round(v, 4) for k, v in measured.phases_s.items()})
                if opts.profile:
                    result.profile = _timed(result, "profile", lambda: judge.profile(reference, report))
        if opts.check_hacks:
            ablate = functools.partial(judge.ablate, reference)
            _timed(result, "ablation", lambda: judge.beside_others("ablation", ablate))
        link.ask("finish")
    except Failure as caught:
        failure = caught
    except BaseException as exc:  # the harness itself failed on this input: say so, do not guess
        failure = harness_failure(exc, workdir)
    finally:
        link.stop(wait=failure is not None)
        result.phases_s.update({name: round(seconds, 4) for name, seconds in link.costs.items()})
        if gate is not None:  # what the GPU's gate cost others and this evaluation: a run's rate is bounded by it
            result.phases_s.update({f"gate_{name}": round(seconds, 4) for name, seconds in gate.spent.items()})
        result.memory_gib = dict(judge.memory_gib)
    return verdict.decide(result, judge.report.correctness if judge.report else None, failure, judge.findings,
                          judge.notes, opts)


# -- helpers -----------------------------------------------------------------------------------------------------


def wall_clock_excess(claimed_ms: float, seen_ms: float) -> str | None:
    """What the candidate's process timed a call at against what the judge's wall clock saw of it beyond a null call
    (medians over the trials): None while the wall clock allows the claim (`WALL_FACTOR` x it + `WALL_MARGIN_MS`)."""
    if seen_ms <= WALL_FACTOR * claimed_ms + WALL_MARGIN_MS:
        return None
    return (f"your process timed {claimed_ms:.4f} ms per call, but the judge saw {seen_ms:.4f} ms of work per call "
            "until the device was idle")


def harness_failure(exc: BaseException, workdir: Path) -> Failure:
    """The verdict when the judge itself raised (it never runs candidate code). A CUDA error of its own (memory, or a
    mapping of the subject's memory: `cudaErrorMapBufferObjectFailed` was seen under many evaluations at once on an
    H100) says nothing of the candidate: `SandboxError`, which the scheduler runs again and no cache keeps. Anything
    else stays the input's error, as it would be on every run."""
    tb = trimmed_traceback(exc, workdir)
    if isinstance(exc, (torch.AcceleratorError, torch.OutOfMemoryError)):
        return Failure(Status.CRASHED, "SandboxError", f"the judge's GPU work failed ({type(exc).__name__}: {exc})", tb)
    return Failure(Status.RUNTIME_ERROR, type(exc).__name__, f"evaluation failed: {exc}", tb)


_DYNAMO_DISABLED: list[Callable[..., Any]] = []  # found by the fork server (`find_dynamo_disabled`) before it forks


def find_dynamo_disabled() -> None:
    """torch's functions wrapped in `torch._disable_dynamo`, its Python references and meta kernels among them (the
    estimate of a task's memory on the meta device runs them): each wrapper imports torch._dynamo at its first call,
    only to keep dynamo from tracing its function. That import took 1.7 s of each evaluation's judge on an H100's host
    once the fork server no longer made it (docs/benchmarks.md)."""
    _DYNAMO_DISABLED[:] = [fn for obj in gc.get_objects() if type(obj) is types.FunctionType
                           and (fn := guards.dynamo_wrapped(obj)) is not None]


def call_dynamo_disabled_directly() -> None:
    """In the judge's process only (the subject, forked before, keeps torch's own wrappers for the candidate), while
    torch._dynamo is not imported, and not when the reference is compiled: each wrapper finds its function as the
    one to call and imports nothing. Where dynamo is not imported nothing traces, and the function called as it is
    behaves as `torch._dynamo.disable` would make it behave."""
    if "torch._dynamo" in sys.modules:
        return
    for fn in _DYNAMO_DISABLED:
        with contextlib.suppress(AttributeError, TypeError):  # a builtin takes no attributes: its wrapper imports
            setattr(fn, "__dynamo_disable", fn)  # the name torch._compile's wrapper looks up


def sizes_on_meta(module: Any) -> tuple[int | None, int | None]:
    """Bytes of the tensors the reference's `get_inputs` makes and of its outputs for them, from a model built and run
    on the meta device (nothing is allocated); None for what cannot be known without running it for real."""
    try:
        with torch.device("meta"):
            inputs = module.get_inputs()
    except Exception:
        return None, None
    try:
        with torch.device("meta"), torch.no_grad():
            outputs = module.Model(*module.get_init_inputs())(*inputs)
    except Exception:
        outputs = None
    return correctness.tensor_bytes(inputs), None if outputs is None else correctness.tensor_bytes(outputs)


def warm_up(device: torch.device) -> None:
    """Start-up costs paid before the evaluation's start signal, while the previous evaluation may still run:
    the CUDA context, the profiler's CUPTI initialisation, the caching allocator."""
    if device.type != "cuda":
        return
    with profiling.cuda_profiler(cpu=False):
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize()


def environment(device: torch.device) -> Environment:
    gpu = device.type == "cuda"
    return Environment(
        device=torch.cuda.get_device_name(device) if gpu else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        interpreter=interpreting(),
        gpu=gpu,
    )


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _timed(result: EvalResult, phase: str, step: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return step()
    finally:
        result.phases_s[phase] = round(time.perf_counter() - start, 4)


def _sync_for(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _like(mapped: Any, values: list[Any]) -> bool:
    """Whether buffers a subject shared stand for these values: a tensor of the same shape and dtype for each one."""
    return isinstance(mapped, list) and len(mapped) == len(values) and all(
        isinstance(m, torch.Tensor) and m.shape == v.shape and m.dtype == v.dtype
        for m, v in zip(mapped, values) if isinstance(v, torch.Tensor))


def _detached(out: Any) -> Any:
    """A forward's outputs without their autograd graph: in a grad mode it holds what the forward saved for a
    backward that never comes (inputs a weight's gradient needs, activations) as long as the outputs live."""
    return torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out)


def _positive(value: Any) -> float:
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    raise Failure(Status.CRASHED, "BadReply", f"the candidate's process reported a timing of {value!r}")


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 31


def _counts(value: Any) -> list[int]:
    """The subject's `thread_interruptions` of a call (a diagnostic: one it forges misleads only its own notes)."""
    return value if isinstance(value, list) and len(value) == 3 and all(map(_is_count, value)) else [0, 0, 0]


def _count(value: Any) -> int:
    """A count the subject reports of a call (`driver_allocations`; a diagnostic, as `_counts`)."""
    return value if _is_count(value) else 0


def _profile_from(data: Any) -> Profile:
    if not isinstance(data, dict):
        return Profile(note="the candidate's process sent no profile")
    try:
        kernels = [KernelTime(**k) for k in data.get("kernels", [])]
        return Profile(**{**data, "kernels": kernels})
    except TypeError:
        return Profile(note="the candidate's process sent a malformed profile")


def _identical(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and guards._same_values(a, b)
    return type(a) is type(b) and not isinstance(a, channel.Opaque) and a == b


def _described(out: Any) -> str:
    """A forward's outputs as a sentence's object: "a float32 tensor of shape (4096, 2048)", or a list of them."""
    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            name = str(value.dtype).removeprefix("torch.")
            return f"{'an' if name[0] in 'aeiou' else 'a'} {name} tensor of shape {tuple(value.shape)}"
        return f"a {type(value).__name__}"

    outputs = correctness.flatten_outputs(out)
    if len(outputs) == 1:
        return one(outputs[0])
    shown = "; ".join(one(value) for value in outputs[:4])
    return f"{len(outputs)} outputs: {shown}" + ("; ..." if len(outputs) > 4 else "")


def _stderr(path: Path) -> tuple[str, list[str]]:
    """The end of the subject's stderr, after the lines before it that name a cause (a C++ abort prints its error
    first and then a long stack, which alone would fill the end); and the lines naming a cause anywhere in it."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "", []
    if not text.strip():
        return "", []
    causes = [line.strip()[:300] for line in text.splitlines()
              if STDERR_CAUSE.search(line) and not line.startswith("frame #")][:STDERR_CAUSE_LINES]
    before = {line.strip()[:300] for line in text[:-STDERR_TAIL].splitlines()}
    head = [line for line in causes if line in before]  # the tail shows the others
    shown = "".join(f"{line}\n" for line in head) + ("...\n" if head else "")
    return f"[stderr]\n{shown}{text[-STDERR_TAIL:]}", causes
