"""The correctness phase: trials on fresh inputs in every mode, the precision rule on one of them, and which modes
ran the candidate's own kernels.

Each trial draws new inputs from a secret seed, computes the reference's outputs in the judge, hands the inputs over
and compares what the subject's call returned (drkernel.sandbox.correctness). One trial, chosen at random, also
measures the candidate's error against a float64 evaluation of the reference (`Exact`). The phase returns a
`CorrectnessReport`: the summary the result shows, the launches the later phases read, and its findings and notes.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from drkernel.sandbox import correctness, guards
from drkernel.sandbox.gpu_policy import precision_budget
from drkernel.sandbox.judge_context import JudgeContext
from drkernel.sandbox.reference import Reference, detached
from drkernel.sandbox.subject import MODES
from drkernel.sandbox.verdict import Failure, Finding, PhaseOutcome, establishing
from drkernel.schema import Correctness, ErrorKind, EvalOptions, Precision, Status

DEGENERACY_SAMPLE = 1 << 20  # elements of the reference's output kept to judge whether the task is degenerate


@dataclass
class Exact:
    """A trial's float64 reference outputs, and the precision rule applied to the candidate's."""

    outputs: Any
    rows: slice | None = None  # the rows of the batch they stand for (None: all)

    def judge(self, ref_out: Any, cand_out: Any, opts: EvalOptions) -> tuple[Precision | None, Finding | None]:
        """The candidate's precision, and the `precision_downcast` finding where the rule refuses it."""
        if self.rows is not None:
            batch = correctness.flatten_outputs(ref_out)[0].shape[0]
            ref_out, cand_out = (correctness.rows_of(v, self.rows, batch) for v in (ref_out, cand_out))
        errors = correctness.errors_against(self.outputs, ref_out, cand_out)
        if errors is None:
            return None, None
        cand_err, ref_err, dtype = errors
        floor = torch.finfo(dtype).eps
        ratio = cand_err / max(ref_err, floor)
        finding = None
        if opts.precision == "matched" and ratio > opts.precision_factor:
            finding = Finding(
                guards.PRECISION_DOWNCAST,
                f"the outputs' error against a float64 evaluation is {cand_err:.2g}, {ratio:.0f}x the reference's own "
                f"({ref_err:.2g}; at most {opts.precision_factor:g}x allowed): about {correctness.bits(cand_err):.0f} "
                f"correct bits where {dtype} gives {correctness.bits(max(ref_err, floor)):.0f}, the error of "
                f"{correctness.arithmetic_like(cand_err)} arithmetic. Compute in the reference's precision (for "
                "tl.dot on float32, input_precision=\"ieee\"; no float16/bfloat16 casts).",
            )
        return Precision(rule=opts.precision, candidate_error=cand_err, reference_error=ref_err, ratio=ratio,
                         factor=opts.precision_factor), finding


@dataclass(kw_only=True)
class CorrectnessReport(PhaseOutcome):
    correctness: Correctness
    launches_by_mode: dict[str, int] = field(default_factory=dict)
    own_counts: dict[str, int] = field(default_factory=dict)
    first_trial_s: float = 0.0

    @property
    def ran_kernels(self) -> bool:
        """Whether the candidate's own Triton kernels ran in any trial."""
        return sum(self.launches_by_mode.values()) > 0


class CorrectnessPhase:
    def __init__(self, ctx: JudgeContext) -> None:
        self.ctx = ctx

    def run(self, reference: Reference) -> CorrectnessReport:
        return self.ctx.gpu.shared_or_alone("correctness", lambda alone: self._check(reference, alone))

    def _check(self, reference: Reference, alone: bool) -> CorrectnessReport:
        opts, gpu = self.ctx.options, self.ctx.gpu
        trials = max(opts.correctness_trials, len(MODES) if opts.check_hacks else 0)
        with establishing(CorrectnessReport(correctness=Correctness(trials=trials))) as report:
            precision_trial = self.ctx.rng.randrange(trials)
            ref_samples: list[torch.Tensor] = []
            started = time.perf_counter()
            # A large evaluation holds the GPU once for all its trials: both processes keep their memory from trial
            # to trial instead of giving back and allocating again several GB each, and no large evaluation's trials
            # but a paired one's come in between. Ordinary ones hold it trial by trial, letting others' timing in
            # between; one checked again alone holds it once, exclusively.
            checks = functools.partial(gpu.hold, "correctness", alone, gpu.memory.pairs)
            once = gpu.memory.large or alone
            whole, per_trial = (checks, contextlib.nullcontext) if once else (contextlib.nullcontext, checks)
            with whole():
                for trial in range(trials):
                    with per_trial():
                        self._trial(reference, trial, trial == precision_trial, report, ref_samples)
                    if trial == 0:
                        report.first_trial_s = time.perf_counter() - started
            self._check_modes(report)
            if len(ref_samples) == 2:
                why = correctness.degeneracy(*ref_samples)
                if why:
                    report.notes.append(f"degenerate_task: {why}")
        return report

    def _trial(self, reference: Reference, trial: int, with_precision: bool, report: CorrectnessReport,
               ref_samples: list[torch.Tensor]) -> None:
        ctx, opts, summary = self.ctx, self.ctx.options, report.correctness
        label = list(MODES)[trial % len(MODES)]
        training, grad_mode = MODES[label]
        inputs = reference.inputs(ctx.secret_seed())
        reference.model.train(training)
        with grad_mode():
            ref_out = detached(reference.call(*inputs))
        # Everything the judge needs of these inputs is computed before the subject sees them (on a GPU it maps them);
        # then they go, and only the subject's copy lives through its call and the comparison (`hand_over`).
        precision = self._precision(reference, inputs, ref_out, training, grad_mode, report.notes) \
            if with_precision else None
        shared = {"inputs": inputs}
        del inputs
        try:
            reply, payloads = ctx.link.hand_over("call", shared, mode=label, forget_inputs=ctx.gpu.memory.large)
        except Failure as failure:
            raise ctx.link.named_outputs(failure, ref_out) from None
        cand_out = ctx.link.map_and_keep(reply, payloads, "outputs")
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
            report.findings += lower_precision(ref_out, cand_out)
            raise Failure(Status.INCORRECT, ErrorKind.MISMATCH, f"trial {trial} ({label}): {comparison.message}")
        if precision is not None:
            summary.precision, downcast = precision.judge(ref_out, cand_out, opts)
            report.findings += [downcast] if downcast else []
        summary.passed_trials += 1
        if ctx.gpu.memory.large:  # mapped until the next trial's came, they would make the subject put those beside
            ctx.link.drop_kept_mapping()

    def _precision(self, reference: Reference, inputs: list[Any], ref_out: Any, training: bool,
                   grad_mode: Callable[[], Any], notes: list[str]) -> Exact | None:
        """The reference's outputs in float64 on a trial's inputs, or on a slice of their batch where all of them
        would need more than this evaluation's share of the GPU and the reference treats rows separately."""
        device = self.ctx.device
        needed = 2 * sum(t.numel() * 8 for t in [*inputs, *correctness.flatten_outputs(ref_out)]
                         if isinstance(t, torch.Tensor) and t.is_floating_point())  # float64 copies, and headroom
        budget = precision_budget(torch.cuda.get_device_properties(device).total_memory, self.ctx.gpu.memory.large) \
            if device.type == "cuda" else math.inf
        rows = None
        if needed > budget:
            rows = correctness.batch_rows(inputs, ref_out, budget / needed, self.ctx.rng.randrange)
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
                notes.append(f"precision: not measured, a float64 evaluation of the reference needs about "
                             f"{needed / 2**30:.0f} GiB, more than this evaluation's share of the GPU, and {why}")
                return None
            notes.append(f"precision: measured on rows {rows.start}-{rows.stop - 1} of {batch} (a float64 "
                         f"evaluation of all of them needs about {needed / 2**30:.0f} GiB)")
        try:
            with grad_mode():
                return Exact(detached(reference.exact(inputs, training)), rows)
        except Exception as exc:  # a reference that cannot run in float64: the rule cannot be applied
            notes.append(f"precision: not measured, the reference does not run in float64 ({exc})"[:300])
            return None

    def _check_modes(self, report: CorrectnessReport) -> None:
        if not self.ctx.options.check_hacks:
            return
        if not report.ran_kernels:
            report.hack(
                guards.NO_TRITON_KERNEL,
                "ModelNew ran no Triton kernel of its own: the work was done by PyTorch or another library. "
                "Implement the computation in @triton.jit kernels launched from forward.",
            )
            return
        missing = [label for label, n in report.launches_by_mode.items() if n == 0]
        if missing:
            report.hack(
                guards.MODE_DEPENDENT,
                f"ModelNew ran no Triton kernel in mode(s) {', '.join(missing)}: kernels must run whatever the "
                "training flag, autograd or inference mode.",
            )


def lower_precision(ref_out: Any, cand_out: Any) -> list[Finding]:
    """`lower_precision_output` for each output in a lower floating dtype than the reference's."""
    return [Finding(guards.LOWER_PRECISION, f"an output is {cand.dtype} where the reference gives {ref.dtype}: "
                    "computing in lower precision is not the same function.")
            for ref, cand in zip(correctness.flatten_outputs(ref_out), correctness.flatten_outputs(cand_out))
            if isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor)
            and correctness.PRECISION_RANK.get(cand.dtype, 9) < correctness.PRECISION_RANK.get(ref.dtype, 0)]
