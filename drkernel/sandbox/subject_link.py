"""The subject, seen from the judge: requests to the candidate's process, and what its replies are worth.

The judge never runs candidate code; it asks the subject (drkernel.sandbox.subject) for calls on copies of its
inputs. `SubjectLink` sends the requests and reads the replies as evidence: outputs to compare (mapped from the
subject's memory on a GPU), timings to check, findings of the subject's own checks. If the subject dies or breaks the
protocol, the link says how it ended (a `Failure`). `SharedCopies` keeps what the judge shares apart from what it
computes with; `TimedCalls` is the timing phase's hand-over.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from drkernel.sandbox import channel, correctness, guards
from drkernel.sandbox.channel import Channel, ChannelClosed, Encoder
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.verdict import Failure, Finding
from drkernel.schema import ErrorKind, Status

STOP_WAIT_S = 2.0  # how long the judge waits to learn how the subject ended
LOAD_OP = "load"  # the request that gives the subject the candidate (drkernel.sandbox.subject: `load`)
STDERR_TAIL = 3000
STDERR_CAUSE = re.compile(  # lines worth keeping: C++ and CUDA errors, Python's, the C library's heap checks
    r"terminate called|what\(\):|CUDA error|\w+Error\b:|Assertion|(?:malloc|free)\(\)|corrupted")
STDERR_CAUSE_LINES = 6
ABORT_HINT = ("; most often a kernel that loaded or stored outside its tensors (on the GPU an illegal memory access, "
              "a CUDA error raised where it cannot be caught; on the CPU a corrupted heap): check each store's size "
              "against its output")

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


def kill_and_reap(pid: int, wait: bool) -> int | None:
    """SIGKILL the caller's child `pid` and, with `wait`, reap it: its wait status, None if not known within
    STOP_WAIT_S (or not waited for)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not wait:
        return None
    deadline = time.monotonic() + STOP_WAIT_S
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)


class ChildSubject:
    """The subject as the judge's own child process, which the judge signals and reaps itself."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.reaped: int | None = None  # its wait status, once reaped

    def end(self, wait: bool = True) -> int | None:
        """Kill it and return its wait status, None if it is not known within STOP_WAIT_S (or not waited for). Where
        Landlock scopes signals, the judge cannot signal the subject's domain: the subject then ends with the judge
        (its parent-death signal, the PID namespace, the supervisor's kill of the process group). Once reaped, it is
        not signalled again (its PID may be another's by then)."""
        if self.reaped is None:
            self.reaped = kill_and_reap(self.pid, wait)
        return self.reaped


class SubjectProcess(Protocol):
    """How the judge ends the subject's process and learns how it ended: as its parent (`ChildSubject`), or through
    the process that forked it (drkernel.sandbox.judge_host)."""

    def end(self, wait: bool = True) -> int | None: ...


class SubjectLink:
    """Requests to the subject process. Its replies are evidence: outputs to compare, timings to check, findings to
    keep (`reported`). If it dies or breaks the protocol, the evaluation fails with what the judge saw."""

    def __init__(self, conn: Channel, process: SubjectProcess, scratch: Path, device: torch.device,
                 gate: DeviceGate | None) -> None:
        self.conn, self.process, self.scratch, self.device, self.gate = conn, process, scratch, device, gate
        self.reported: list[Finding] = []  # what the subject's checks found, and how it ended (`exit_called`)
        self.shares = SharedCopies(device) if device.type == "cuda" else None
        # What the two processes cost beyond the work itself, in seconds: requests' round trips less the subject's
        # time in its handlers (the socket, encoding, mapping inputs), collecting shared blocks, mapping outputs.
        self.costs = {"handover": 0.0, "ipc_collect": 0.0, "map_outputs": 0.0}
        self.peak_bytes = 0  # the most the subject's allocator held in a request since this was last set to 0
        self._kept_mapping: Any = None  # the values mapped last, kept open until the next are (`map_and_keep`)
        self.death: Failure | None = None  # how the subject ended, once the judge has seen it
        self.candidate_handed = False  # whether the subject has been given the candidate: before, no candidate code ran

    def ask(self, op: str, values: dict[str, Any] | None = None, **fields: Any) -> tuple[dict[str, Any], list]:
        """The subject's reply to a request with `values` (left as they are) and `fields`."""
        return self._ask(op, dict(values or {}), fields)

    def hand_over(self, op: str, values: dict[str, Any], **fields: Any) -> tuple[dict[str, Any], list]:
        """`ask`, taking `values` from the caller: the dict is emptied once encoded, so that where the caller keeps
        nothing else of them, only the subject's copy lives through its work (the encoder's shared copies on a GPU,
        bytes on the CPU)."""
        taken = dict(values)
        values.clear()
        return self._ask(op, taken, fields)

    def _ask(self, op: str, values: dict[str, Any], fields: dict[str, Any]) -> tuple[dict[str, Any], list]:
        self._collect()
        start = time.perf_counter()
        encoder = self._encoder()
        header = {"op": op, **fields, **{k: encoder.encode(v) for k, v in values.items()}}
        if values:
            sync_for(self.device)()  # the values (and their shared copies) are written before the subject reads them
            values.clear()
        try:
            self.conn.send(header, encoder.payloads)
            self.candidate_handed = self.candidate_handed or op == LOAD_OP
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
        """Keep what the subject's checks found (known reason codes only); raise its classified failure, if any."""
        found = reply.get("findings")
        for code, message in (found.items() if isinstance(found, dict) else ()):
            if code in guards.REASON_CODES:
                self.reported.append(Finding(code, str(message)[:2000]))
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
            sync_for(self.device)()
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

    def map_and_keep(self, reply: dict[str, Any], payloads: list, key: str) -> Any:
        """The values a reply describes, mapped (on a GPU, from the subject's memory through CUDA IPC) and kept mapped
        until the next ones are (or `drop_kept_mapping`): the subject's next outputs mostly lie in the same
        allocation, which is then found open instead of opened and closed again (both are calls that take the
        driver's lock for the whole host)."""
        start = time.perf_counter()
        try:
            values = channel.decode(reply[key], payloads, self.device)
        except (KeyError, channel.BadMessage) as exc:
            raise Failure(Status.CRASHED, ErrorKind.BAD_REPLY,
                          f"the candidate's process sent a malformed answer: {exc}")
        finally:
            self.costs["map_outputs"] += time.perf_counter() - start
        self._kept_mapping = values
        return values

    def drop_kept_mapping(self) -> None:
        """Let the last mapping go (the end of a phase: the subject may give its memory back)."""
        self._kept_mapping = None

    def _reply(self) -> tuple[dict[str, Any], list]:
        """The reply, letting the GPU's gate go while the subject's Triton compiles a kernel."""
        while True:
            reply, payloads = self.conn.receive()
            stage = reply.get("compile")
            if stage is None:
                return reply, payloads
            if self.gate is not None and stage == "start":
                self.gate.pause(sync_for(self.device))
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
        if failure.status is not Status.CRASHED or failure.kind != ErrorKind.SIGNAL:
            return failure
        self.death = Failure(failure.status, failure.kind,
                             f"{failure.message}; for these inputs the reference returns {described(ref_out)}",
                             failure.tb)
        return self.death

    def _classify_death(self, exc: Exception) -> Failure:
        status = self.stop()
        tail, causes = stderr_causes(self.scratch / "stderr.txt")
        if not self.candidate_handed:  # no candidate code ran in it: the harness's failure, run again
            how = (f"killed by signal {os.WTERMSIG(status)}" if status is not None and os.WIFSIGNALED(status) else
                   f"exit code {os.WEXITSTATUS(status)}" if status is not None else "its end unknown")
            return Failure(Status.CRASHED, ErrorKind.SANDBOX_ERROR,
                           f"the subject process ended before it was given the candidate ({how}): the harness's "
                           "failure", tail)
        if isinstance(exc, channel.BadMessage):
            return Failure(Status.CRASHED, ErrorKind.BAD_REPLY, f"the candidate's process broke the protocol: {exc}",
                           tail)
        if status is not None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            hint = ABORT_HINT if sig == signal.SIGABRT else ""
            said = f"; it printed: {' / '.join(causes[:2])}" if causes else ""
            return Failure(Status.CRASHED, ErrorKind.SIGNAL,
                           f"the evaluation process was killed by {name} ({signal.strsignal(sig)}){hint}{said}", tail)
        code = os.WEXITSTATUS(status) if status is not None else None
        self.reported.append(Finding(guards.EXIT_CALLED, "the candidate ended its process (os._exit or similar): a "
                                             "failure."))
        return Failure(Status.CRASHED, ErrorKind.EXIT,
                       f"the evaluation process exited with code {code} before it answered", tail)

    def stop(self, wait: bool = True) -> int | None:
        """End the subject (whatever it is doing) and return its wait status, None if it is not known in time (or not
        waited for: a subject that answered to the end need not be seen to die before the verdict goes out; its
        CUDA context takes about 0.1 s to go)."""
        self.conn.sock.close()
        return self.process.end(wait)


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
                 part: Callable[[str], contextlib.AbstractContextManager[None]],
                 frees_cache: Callable[[], bool]) -> None:
        self.link, self.template = link, template
        self.part = part  # counts the time of the phase's parts by name: here "stage" and "release"
        self.frees_cache = frees_cache  # asked at the end: whether the subject gives its cached memory back too
        self.staged = link.device.type == "cuda"
        self.inputs: list[Any] = []  # staged: the subject's input buffers, as mapped here; else the next call's values
        self.outputs: Any = None  # staged: the subject's output buffers, as mapped here

    def __enter__(self) -> TimedCalls:
        if self.staged:
            with self.part("stage"):
                reply, payloads = self.link.ask("stage", {"inputs": self.template})  # (ask waits for the device)
                self.inputs = self.link.map_and_keep(reply, payloads, "inputs")
            if not _like(self.inputs, self.template):
                raise Failure(Status.CRASHED, ErrorKind.BAD_REPLY,
                              "the candidate's process shared input buffers unlike the values they stand for")
        return self

    def __exit__(self, *exc: Any) -> None:
        """Both sides let the phase's buffers go before the next phase (a profile of a large problem needs the
        memory, given back as `frees_cache` says); a subject already gone holds nothing."""
        staged, self.inputs, self.outputs = self.staged, [], None
        if staged and exc[0] is None:
            with self.part("release"):
                self.link.ask("release", give_back=self.frees_cache())

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
            self.outputs = self.link.map_and_keep(reply, payloads, "outputs")
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
        outputs = self.link.map_and_keep(reply, payloads, "outputs")
        if reply.get("staging") is True:  # the subject's output buffers, shared anew
            self.outputs = outputs
        return reply, wall, outputs

    def _request(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return ({}, {"staged": True}) if self.staged else ({"inputs": self.inputs}, {})



def sync_for(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _like(mapped: Any, values: list[Any]) -> bool:
    """Whether buffers a subject shared stand for these values: a tensor of the same shape and dtype for each one."""
    return isinstance(mapped, list) and len(mapped) == len(values) and all(
        isinstance(m, torch.Tensor) and m.shape == v.shape and m.dtype == v.dtype
        for m, v in zip(mapped, values) if isinstance(v, torch.Tensor))


def described(out: Any) -> str:
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


def stderr_causes(path: Path) -> tuple[str, list[str]]:
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
