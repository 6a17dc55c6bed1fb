"""What every phase of the judge reads: the request, its working directory, the device, the link to the subject,
the GPU's policy, and seeds nobody else learns.

Phases share nothing else: each returns what it found (drkernel.sandbox.verdict.PhaseOutcome).
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drkernel.sandbox.gpu_policy import GpuPolicy
from drkernel.sandbox.subject_link import SubjectLink
from drkernel.schema import EvalOptions, EvalRequest


@dataclass
class JudgeContext:
    request: EvalRequest
    workdir: Path
    device: torch.device
    link: SubjectLink
    gpu: GpuPolicy
    # trial seeds, checked calls, sampled positions: drawn here, never sent to the subject before they are used
    rng: random.Random = field(default_factory=lambda: random.Random(secrets.randbits(64)))

    @property
    def options(self) -> EvalOptions:
        return self.request.options

    def secret_seed(self) -> int:
        return self.rng.randrange(1 << 31)
