"""The timing phase: both sides timed call by call on values never seen before, the candidate's timings checked
against the judge's wall clock and against the bandwidth its outputs need, every timed output checked.

The reference is timed here, the candidate in its own process (drkernel.sandbox.subject_link.TimedCalls; the timer
itself is drkernel.sandbox.timing). The phase returns a `Measurement`: the timings, the speedup and its interval,
where the phase's time went, and its findings and notes.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from drkernel.sandbox import correctness, guards, timing
from drkernel.sandbox.correctness_phase import CorrectnessReport
from drkernel.sandbox.judge_context import JudgeContext
from drkernel.sandbox.reference import Reference
from drkernel.sandbox.startup import interpreting
from drkernel.sandbox.subject_link import TimedCalls, sync_for
from drkernel.sandbox.verdict import Failure, Finding, PhaseOutcome, establishing
from drkernel.schema import ErrorKind, Status, Timing

CHECKED_TIMING_TRIALS = 1  # timed calls, chosen at random, whose outputs are compared in full (all: on a sample)
TIMED_SAMPLE_ELEMENTS = 4096  # elements per output compared after every other timed call
# The judge's wall-clock view of a timed call (less the null calls') may exceed the subject's event timing by this
# much before the timing is not believed: a factor for work outside the events, a margin for the host's noise.
WALL_FACTOR, WALL_MARGIN_MS = 1.5, 1.0
# The timing phase's parts in `phases_s` (as timing_<part>): the timer and the buffers shared for the phase, filling
# the inputs, the warm-up calls, the reference's timed calls, the candidate's (requests included), the null calls,
# comparing outputs, the checks on the timing, both sides letting the phase's buffers go.
TIMING_PARTS = ("stage", "refill", "warmup", "reference", "candidate", "null", "verify", "checks", "release")


@dataclass(kw_only=True)
class Measurement(PhaseOutcome):
    timing: Timing
    speedup: float
    interval: list[float]
    phases_s: dict[str, float]  # the timing phase's parts (TIMING_PARTS), seconds
    unsteady: list[str] = field(default_factory=list)  # a side whose median is a slow call (timing.unsteady)


class TimingPhase:
    def __init__(self, ctx: JudgeContext) -> None:
        self.ctx = ctx

    def run(self, reference: Reference, report: CorrectnessReport) -> Measurement:
        """Both sides timed trial by trial, in alternating order, on values never seen before: the reference here, the
        candidate in its process (its event timing checked against the judge's wall clock), every candidate output
        compared on a sample, a few chosen calls in full.

        When the wall-clock check fires, or a side's median call is a slow one (above twice its fastest: a fifth of
        the candidates' medians in an RL run beside other runs' evaluations, docs/miniature.md), the whole
        measurement is made once more and only the second one counts, its timings and its check: a host that
        stalled some of the calls (a legitimate kernel was `side_stream_timing` on an H200 beside other runs'
        evaluations) gets a clean measurement, work hidden on another stream shows again, and a candidate that
        changes its behaviour for the second measurement is timed as it then behaves. A second one still unsteady
        says so in the notes."""
        spent = dict.fromkeys(TIMING_PARTS, 0.0)  # where the phase's time goes, in seconds, over both measurements
        # whatever the first measurement's timings say, what it found in the outputs and launches stays found
        with establishing(PhaseOutcome()) as so_far:
            measured, suspicions = self._measure_once(reference, report, spent, so_far)
            why = suspicions.get(guards.SIDE_STREAM) or "; ".join(measured.unsteady)
            if why:
                so_far.notes.append(f"timing measured again: in the first measurement {why}")
                measured, suspicions = self._measure_once(reference, report, spent, so_far)
                measured.timing.measurements = 2
        measured.findings = [*so_far.findings, *(Finding(reason, message) for reason, message in suspicions.items())]
        measured.notes = [*so_far.notes, *(f"timing: {text}: the speedup may be off (a busy host or GPU); "
                                           "timing.*.samples_ms holds every call" for text in measured.unsteady)]
        return measured

    def _measure_once(self, reference: Reference, report: CorrectnessReport, spent: dict[str, float],
                      found: PhaseOutcome) -> tuple[Measurement, dict[str, str]]:
        """One measurement (what it finds in the outputs and the launches goes to `found`), and the hack reasons its
        timings alone suggest (`run` decides what counts)."""
        ctx, opts = self.ctx, self.ctx.options
        reference.model.train(False)
        args = reference.inputs(ctx.secret_seed())  # the reference's inputs, new before every call
        checked = set(ctx.rng.sample(range(opts.perf_trials), min(CHECKED_TIMING_TRIALS, opts.perf_trials)))

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
                args.extend(reference.inputs(ctx.secret_seed()))
                calls.load(args)
                sync_for(ctx.device)()

        with part("stage"):
            timer = timing.CallTimer(ctx.device)
        host_ms: dict[str, list[float]] = {"reference": [], "candidate": []}
        calls = TimedCalls(ctx.link, args, part, ctx.gpu.frees_cache_now)
        # No collection in this process while it times (its wall clock of the candidate's calls included).
        with timing.collector_paused(), torch.no_grad(), calls:
            for _ in range(max(1, opts.warmup_trials)):  # at least one: its host time sets the spin
                refill()
                with part("warmup"):
                    warm_out, warm_host_ms = timer.untimed(reference.call, args)
                    host_ms["reference"].append(warm_host_ms)
                    reply = calls.warm()
                    host_ms["candidate"].append(_positive(reply.get("host_ms", 0.0)))
            placed = timing.Placements.for_call(ctx.device, [args, warm_out])  # the subject places its own likewise
            placed.reserve([args, warm_out])
            del warm_out
            # Each side's spin outlasts its own enqueueing, as seen so far (not the first warm-up: it may compile);
            # the null calls spin as the candidate's calls do.
            spins: dict[str, list[float]] = {"reference": [], "candidate": []}
            ref, cand = timing.Samples(), timing.Samples()
            own_per_call: list[int] = []
            unjoined_ms: list[float] = []  # per timed call: work left running on other streams, past its end
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
                if ctx.device.type == "cuda":
                    ref.driver_allocations.append(timer.driver_allocations)
                    cand.driver_allocations.append(_count(reply.get("driver_allocations")))
                ref.event_ms.append(ref_ms)
                cand.event_ms.append(_positive(reply.get("event_ms")))
                unjoined_ms.append(_positive(reply.get("unjoined_ms", 0.0)))
                # A null call right after (the same steps and hand-over around no call): what the wall clock sees
                # beyond the call itself, under the host's load of the moment.
                with part("null"):
                    null_wall = calls.timed(cand_spin_ms, null=True)[1]
                cand.wall_ms.append(max(0.0, wall - null_wall))
                own_per_call.append(int(reply.get("own", 0)))
                with part("verify"):
                    found.findings += recomputed(ctx, trial, trial in checked, ref_out, cand_out)
                placed.keep(list(args), ref_out)
                del ref_out, cand_out
        if timer.l2_tampered:
            found.hack(guards.L2_PERSISTENCE, "persisting-L2 settings changed while the reference was timed: the "
                       "candidate's process set them.")
        if opts.check_hacks and own_per_call and min(own_per_call) == 0 and report.ran_kernels:
            found.hack(guards.MODE_DEPENDENT,
                       "some timed calls ran no Triton kernel: the candidate changes behaviour between calls.")
        method = "cuda_event" if ctx.device.type == "cuda" else ("interpreter_wall" if interpreting() else "cpu_wall")
        result = Timing(reference=timing.summarize(ref, method, statistics.median(spins["reference"])),
                        candidate=timing.summarize(cand, method, statistics.median(spins["candidate"])),
                        reference_mode=opts.reference_mode)
        if method == "interpreter_wall":
            result.note = "Triton interpreter on the CPU: these timings say nothing of GPU speed"
        suspicions: dict[str, str] = {}
        with part("checks"):  # on the CPU too: its timings are wall time, which the judge's clock bounds alike
            assert result.candidate is not None
            # On the CPU the judge's clock sees the subject's process scheduled beside everything else on the host (a
            # legitimate 3.4 ms interpreted call was seen at 17.4 ms on two busy cores): its least disturbed call.
            seen = statistics.median(cand.wall_ms) if ctx.device.type == "cuda" else min(cand.wall_ms)
            excess = wall_clock_excess(result.candidate.median_ms, seen)
            if excess is not None:
                suspicions[guards.SIDE_STREAM] = (f"{excess}: work ran outside the timed stream, or the timing "
                                                  "was tampered with. Launch kernels on the current stream.")
        if ctx.device.type == "cuda":
            with part("checks"):
                left_running = [ms for ms in unjoined_ms if ms > 0]
                if len(left_running) * 2 > len(unjoined_ms):
                    suspicions[guards.SIDE_STREAM] = (
                        f"in {len(left_running)} of {len(unjoined_ms)} timed calls, work the call started on other "
                        f"streams was still running when it returned ({statistics.median(left_running):.4f} ms at the "
                        "median; it is counted in the timing): join every stream to the current one before returning.")
                too_fast = self._too_fast(result.candidate.median_ms, args, reference)
                if too_fast is not None:
                    suspicions[guards.IMPOSSIBLE_SPEED] = too_fast
        speedup = result.reference.median_ms / max(result.candidate.median_ms, 1e-9)  # type: ignore[union-attr]
        unsteady = [text for side, samples in (("reference", ref), ("candidate", cand))  # CPU wall times say nothing
                    if method == "cuda_event" and (text := timing.unsteady(side, samples, spins[side]))]
        return Measurement(timing=result, speedup=speedup,
                           interval=timing.speedup_interval(ref.primary, cand.primary, opts.seed),
                           phases_s={f"timing_{name}": seconds for name, seconds in spent.items()},
                           unsteady=unsteady), suspicions

    def _too_fast(self, median_ms: float, args: list[Any], reference: Reference) -> str | None:
        """The candidate's timed calls against the bytes its outputs must be written in, at the GPU's bandwidth."""
        with torch.no_grad():
            out = reference.call(*args)
        out_bytes = correctness.tensor_bytes(out)
        floor_ms = out_bytes / timing.measure_bandwidth(self.ctx.device) * 1e3
        if median_ms >= 0.5 * floor_ms:
            return None
        return (f"{median_ms:.4f} ms is faster than writing the {out_bytes} output bytes allows on this GPU "
                f"({floor_ms:.4f} ms at its measured bandwidth).")

    # -- profile and ablation --------------------------------------------------------------------------------



def recomputed(ctx: JudgeContext, trial: int, full: bool, ref_out: Any, cand_out: Any,
               call: str = "a timed call") -> list[Finding]:
    """`output_caching` for a timed (or profiled) call whose outputs are wrong: a remembered answer differs almost
    everywhere from the one for new values. `full`: compared in full, else on a sample of secret positions."""
    opts = ctx.options
    if full:
        compared = correctness.compare(ref_out, cand_out, trial, opts.atol, opts.rtol, opts.rel_error_bound)
    else:
        generator = torch.Generator(device=ctx.device).manual_seed(ctx.rng.randrange(1 << 62))
        compared = correctness.compare_sample(ref_out, cand_out, trial, opts.atol, opts.rtol, opts.rel_error_bound,
                                              TIMED_SAMPLE_ELEMENTS, generator)
    if compared.ok:
        return []
    return [Finding(
        guards.OUTPUT_CACHING,
        f"{call} returned a wrong answer for new input values ({compared.message}): outputs must be computed on every "
        "call, never cached or remembered. An answer right in the correctness trials and wrong here can also come "
        "from loads or stores outside a tensor, which read memory that held the right values only by chance: check "
        "each pointer's offsets against the shape of the tensor it points into.",
    )]


def wall_clock_excess(claimed_ms: float, seen_ms: float) -> str | None:
    """What the candidate's process timed a call at (its median) against what the judge's wall clock saw of it beyond
    a null call: None while the wall clock allows the claim (`WALL_FACTOR` x it + `WALL_MARGIN_MS`)."""
    if seen_ms <= WALL_FACTOR * claimed_ms + WALL_MARGIN_MS:
        return None
    return (f"your process timed {claimed_ms:.4f} ms per call, but the judge saw {seen_ms:.4f} ms of work per call "
            "until the device was idle")


def _positive(value: Any) -> float:
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    raise Failure(Status.CRASHED, ErrorKind.BAD_REPLY, f"the candidate's process reported a timing of {value!r}")


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 31


def _counts(value: Any) -> list[int]:
    """The subject's `thread_interruptions` of a call (a diagnostic: one it forges misleads only its own notes)."""
    return value if isinstance(value, list) and len(value) == 3 and all(map(_is_count, value)) else [0, 0, 0]


def _count(value: Any) -> int:
    """A count the subject reports of a call (`driver_allocations`; a diagnostic, as `_counts`)."""
    return value if _is_count(value) else 0

