"""The judge: one evaluation's trusted side, a process in which no candidate code ever runs.

It loads the reference, draws every input from seeds only it knows, computes and times the reference, and asks the
subject (drkernel.sandbox.subject, the candidate's process) for calls on copies of those inputs. It compares the
candidate's outputs itself, measures their precision against a float64 evaluation of the reference, checks the
subject's timings against the wall time it observed, and decides the verdict, which only it can report (on a pipe to
the fork server that the subject never holds). Hooks, torch-function and dispatch modes, dispatcher registrations or
patches the candidate installs live in the subject's interpreter: none of them can touch the reference, the
comparison or the verdict.

`judge_request` runs the phases in order, each in a module of its own, and each returning what it found:
`load_reference` -> `Reference` (drkernel.sandbox.reference); the candidate's load; `CorrectnessPhase` ->
`CorrectnessReport`; `TimingPhase` -> `Measurement`; `ProfilePhase` and `AblationPhase` (drkernel.sandbox.
kernel_checks); `verdict.decide` turns them into the result. The GPU's gate is held as drkernel.sandbox.gpu_policy
decides; the subject is reached through drkernel.sandbox.subject_link.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable

import torch

from drkernel.sandbox import verdict
from drkernel.sandbox.correctness_phase import CorrectnessPhase, CorrectnessReport
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.gpu_policy import GpuPolicy
from drkernel.sandbox.judge_context import JudgeContext
from drkernel.sandbox.kernel_checks import AblationPhase, ProfilePhase
from drkernel.sandbox.reference import Reference, load_reference
from drkernel.sandbox.startup import call_dynamo_disabled_directly, environment
from drkernel.sandbox.loading import trimmed_traceback
from drkernel.sandbox.subject_link import LOAD_OP, SubjectLink
from drkernel.sandbox.timing_phase import TimingPhase
from drkernel.sandbox.verdict import Failure, PhaseOutcome, establish, established_by
from drkernel.schema import Correctness, ErrorKind, EvalRequest, EvalResult, Status


def judge_request(request: EvalRequest, workdir: Path, device: torch.device, gate: DeviceGate | None,
                  link: SubjectLink) -> EvalResult:
    """Judge one request against the subject behind `link` and return the result; never raises for anything the
    candidate does."""
    opts = request.options
    gpu = GpuPolicy(gate, device, link)
    ctx = JudgeContext(request, workdir, device, link, gpu)
    if opts.reference_mode != "compile":
        call_dynamo_disabled_directly()
    result = EvalResult(environment=environment(device))
    outcomes: list[PhaseOutcome] = []  # the phases that ran to their end, in order
    report: CorrectnessReport | None = None
    failure: Failure | None = None
    try:
        with gpu.hold("reference"):
            reference = _timed(result, "reference", lambda: load_reference(
                request.reference, opts, workdir, device, with_sizes=gpu.weighs_memory))
        gpu.weigh(reference.sizes)
        with gpu.hold("load"):
            outcomes.append(_timed(result, "load", lambda: load_candidate(ctx, reference, result)))
        report = _timed(result, "correctness", lambda: CorrectnessPhase(ctx).run(reference))
        outcomes.append(report)
        result.phases_s["correctness_first_trial"] = round(report.first_trial_s, 4)  # Triton compiles here
        if opts.measure_performance or opts.profile:
            waited = time.perf_counter()
            with gpu.hold("timing", alone=True):  # and the profile
                result.phases_s["gpu_wait"] = round(time.perf_counter() - waited, 4)  # others' timing, checks
                if opts.measure_performance:
                    measured = _timed(result, "timing", lambda: TimingPhase(ctx).run(reference, report))
                    outcomes.append(measured)
                    result.timing, result.speedup, result.speedup_ci = (
                        measured.timing, measured.speedup, measured.interval)
                    result.phases_s.update({k: round(v, 4) for k, v in measured.phases_s.items()})
                if opts.profile:
                    profiled = _timed(result, "profile", lambda: ProfilePhase(ctx).run(reference, report))
                    outcomes.append(profiled)
                    result.profile = profiled.profile
        if opts.check_hacks:
            ablate = functools.partial(AblationPhase(ctx).run, reference)
            outcomes.append(_timed(result, "ablation", lambda: gpu.shared_or_alone("ablation", ablate)))
        link.ask("finish")
    except Failure as caught:
        failure = caught
    except BaseException as exc:  # the harness itself failed on this input: say so, do not guess
        failure = harness_failure(exc, workdir)
        establish(failure, established_by(exc) or PhaseOutcome())
    finally:
        link.stop(wait=failure is not None)
        result.phases_s.update({name: round(seconds, 4) for name, seconds in link.costs.items()})
        if gate is not None:  # what the GPU's gate cost others and this evaluation: a run's rate is bounded by it
            result.phases_s.update({f"gate_{name}": round(seconds, 4) for name, seconds in gate.spent.items()})
        result.memory_gib = dict(gpu.memory_gib)
    return verdict.decide(result, _correctness_of(report, failure), outcomes, failure, link.reported, opts)


def load_candidate(ctx: JudgeContext, reference: Reference, result: EvalResult) -> PhaseOutcome:
    """The subject imports the candidate and builds ModelNew with the reference's init inputs; its notes say what
    its static checks saw, and its own confinement goes into the result as the subject's word (`subject_*`): shown,
    never decisive."""
    opts = ctx.options
    reply, _ = ctx.link.ask(LOAD_OP, {"init_inputs": reference.init_inputs}, candidate=ctx.request.candidate,
                            seed=opts.seed, check_hacks=opts.check_hacks, allow_torch_glue=opts.allow_torch_glue)
    layers = reply.get("confinement")
    if isinstance(layers, dict) and result.environment is not None:
        result.environment.confinement.update(
            {f"subject_{k}"[:40]: str(v)[:300] for k, v in list(layers.items())[:10]})
    return PhaseOutcome(notes=[str(n)[:500] for n in reply.get("notes", [])][:20])


def harness_failure(exc: BaseException, workdir: Path) -> Failure:
    """The verdict when the judge itself raised (it never runs candidate code). A CUDA error of its own (memory, or a
    mapping of the subject's memory: `cudaErrorMapBufferObjectFailed` was seen under many evaluations at once on an
    H100) says nothing of the candidate: `SandboxError`, which the scheduler runs again and no cache keeps. Anything
    else stays the input's error, as it would be on every run."""
    tb = trimmed_traceback(exc, workdir)
    if isinstance(exc, (torch.AcceleratorError, torch.OutOfMemoryError)):
        return Failure(Status.CRASHED, ErrorKind.SANDBOX_ERROR,
                       f"the judge's GPU work failed ({type(exc).__name__}: {exc})", tb)
    return Failure(Status.RUNTIME_ERROR, type(exc).__name__, f"evaluation failed: {exc}", tb)


def _correctness_of(report: CorrectnessReport | None, failure: Failure | None) -> Correctness | None:
    """The correctness summary the result shows: the phase's, complete, or as far as it got when it failed."""
    if report is not None:
        return report.correctness
    partial = failure.established if failure is not None else None
    return partial.correctness if isinstance(partial, CorrectnessReport) else None


def _timed(result: EvalResult, phase: str, step: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return step()
    finally:
        result.phases_s[phase] = round(time.perf_counter() - start, 4)
