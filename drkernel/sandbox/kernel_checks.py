"""The phases that check the candidate's own kernels do the work: the profile (how much of the GPU time they take,
`lazy_kernel` below `min_coverage`) and the ablation (whether poisoning what they wrote changes the output:
`decoy_kernel` where it does not).

Both run on fresh inputs whose outputs the judge checks, and each returns its findings (`KernelProfile`,
`Ablation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from drkernel.sandbox import channel, correctness, guards
from drkernel.sandbox.correctness_phase import CorrectnessReport
from drkernel.sandbox.judge_context import JudgeContext
from drkernel.sandbox.reference import Reference
from drkernel.sandbox.subject import MODES
from drkernel.sandbox.timing_phase import recomputed
from drkernel.sandbox.verdict import Failure, PhaseOutcome, establishing
from drkernel.schema import ErrorKind, KernelTime, Profile, Status

PROFILED_CALLS = 3  # profiled forwards, each on inputs of its own
PROFILE_SHARE_OF_MEMORY = 0.5  # the profile holds the GPU alone, but other evaluations' processes keep their memory


@dataclass(kw_only=True)
class KernelProfile(PhaseOutcome):
    profile: Profile


class Ablation(PhaseOutcome):
    """The ablation's findings: decoy kernels, or outputs answered from memory."""


class ProfilePhase:
    def __init__(self, ctx: JudgeContext) -> None:
        self.ctx = ctx

    def run(self, reference: Reference, report: CorrectnessReport) -> KernelProfile:
        """Coverage from calls on fresh inputs whose outputs the judge checks (a candidate whose correctness trials ran
        no kernel of its own is `no_triton_kernel` already: a low coverage adds nothing)."""
        ctx, opts = self.ctx, self.ctx.options
        if ctx.device.type != "cuda":
            return KernelProfile(profile=Profile(launches=dict(report.own_counts),
                                                 note="no GPU: launch counts only, coverage not measured"))
        with establishing(PhaseOutcome()) as found:
            reference.model.train(False)
            sets = [reference.inputs(ctx.secret_seed())]  # the warm-up's, then one set per profiled call
            ref_outs: list[Any] = []
            with torch.no_grad():
                while len(ref_outs) < self._profiled_calls(sets[0], ref_outs[:1]):
                    sets.append(reference.inputs(ctx.secret_seed()))
                    ref_outs.append(reference.call(*sets[-1]))
            reply, payloads = ctx.link.ask("profile", {"inputs": sets}, own_names=sorted(report.own_counts))
            cand_outs = ctx.link.map_and_keep(reply, payloads, "outputs")
            if not isinstance(cand_outs, list) or len(cand_outs) != len(ref_outs):
                raise Failure(Status.CRASHED, ErrorKind.BAD_REPLY,
                              "the candidate's process sent the wrong number of outputs")
            for ref_out, cand_out in zip(ref_outs, cand_outs):
                found.findings += recomputed(ctx, -1, True, ref_out, cand_out, call="a profiled call")
        profile = _profile_from(reply.get("profile"))
        profile.launches = dict(report.own_counts)
        lazy = profile.coverage is not None and profile.coverage < opts.min_coverage
        if opts.check_hacks and lazy and not report.found(guards.NO_TRITON_KERNEL):
            found.hack(
                guards.LAZY_KERNEL,
                f"only {profile.coverage:.1%} of the GPU time is spent in the candidate's own Triton kernels "
                f"(at least {opts.min_coverage:.0%} required): PyTorch does the work. Move the "
                "computation into the kernels.",
            )
        return KernelProfile(profile=profile, findings=found.findings)

    def _profiled_calls(self, inputs: list[Any], outputs: list[Any]) -> int:
        """PROFILED_CALLS, or fewer (at least one) where their memory would pass PROFILE_SHARE_OF_MEMORY of the GPU's:
        each holds an input set in both processes and three outputs (the reference's, the candidate's and its copy);
        the warm-up two input sets. Problems with 6.4 GB inputs ran out of memory with three calls on an H100."""
        if not outputs:  # the first profiled call is made in any case; its output's size is known after it
            return 1
        size_in, size_out = correctness.tensor_bytes(inputs), correctness.tensor_bytes(outputs[0])
        budget = torch.cuda.get_device_properties(self.ctx.device).total_memory * PROFILE_SHARE_OF_MEMORY
        fits = int((budget - 2 * size_in) // max(1, 2 * size_in + 3 * size_out))
        return max(1, min(PROFILED_CALLS, fits))


class AblationPhase:
    def __init__(self, ctx: JudgeContext) -> None:
        self.ctx = ctx

    def run(self, reference: Reference, alone: bool) -> Ablation:
        """In every mode, on fresh inputs: where poisoning what the own kernels wrote leaves the output unchanged, they
        were decoys. Beside others' checks, or `alone`; a large evaluation's beside another large one's where its
        correctness phase may be (`pairs`): the subject holds at most two inputs and an output or an input and two
        outputs at once, the judge two inputs (its own, the shared copy), fewer than the correctness phase's account."""
        with self.ctx.gpu.hold("ablation", alone, self.ctx.gpu.memory.pairs):
            return self._ablate(reference)

    def _ablate(self, reference: Reference) -> Ablation:
        ctx, large = self.ctx, self.ctx.gpu.memory.large
        with establishing(Ablation()) as found:
            for label in MODES:
                reply, payloads = ctx.link.ask("ablate", {"inputs": reference.inputs(ctx.secret_seed())},
                                               mode=label, forget_inputs=large)
                normal = ctx.link.map_and_keep(reply, payloads, "normal")
                ablated = ctx.link.map_and_keep(reply, payloads, "ablated")
                decoys = reply.get("ran") is True and len(normal) == len(ablated) and all(
                    _identical(a, b) for a, b in zip(normal, ablated))
                if large:  # mapped into the next mode's, the subject could not free them: 12 of its 36 GiB there
                    del normal, ablated
                    ctx.link.drop_kept_mapping()
                if reply.get("repeat_differs") is True and ctx.options.check_hacks:
                    found.hack(
                        guards.OUTPUT_CACHING,
                        "called again on inputs holding the same values, forward launched other kernels than the "
                        "first time: it answers values it has seen from memory. Compute the outputs on every call.",
                    )
                if decoys:
                    found.hack(
                        guards.DECOY_KERNEL,
                        f"in mode {label} the output does not depend on anything the candidate's Triton kernels "
                        "computed: they are decoys, and the result comes from other code.",
                    )
                    break
        return found


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
