"""Profiling coverage: how much of the candidate's GPU time runs in its own Triton kernels.

coverage = GPU time of kernels whose names the launch record holds as the candidate's own / all GPU time of the
forward (kernels, copies and memsets). Names are matched exactly, never by substring.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch

from drkernel.schema import KernelTime, Profile

TOP_KERNELS = 8


def cuda_profiler(cpu: bool = True) -> torch.autograd.profiler.profile:
    """A profiler run over the CUDA activity (and the CPU's), through the autograd profiler that `torch.profiler`
    wraps: entering `torch.profiler.profile` asks whether `torch._inductor` is loaded, which imports it and
    `torch._dynamo` (about half a second on an H100's host) in each of an evaluation's two processes, since the fork
    server does not import them (drkernel.sandbox.guards)."""
    return torch.autograd.profiler.profile(use_cpu=cpu, use_device="cuda", use_kineto=True)


def profile_cuda(calls: list[Callable[[], Any]], own_names: set[str],
                 after: Callable[[Any], None] | None = None) -> Profile:
    """Profile `calls` (one forward each, on inputs of their own), each in a profiler run of its own so that
    `after` can take its output (a candidate may reuse one output buffer) outside the profiled window."""
    times: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for call in calls:
        torch.cuda.synchronize()
        with cuda_profiler() as prof:
            out = call()
            torch.cuda.synchronize()
        for event in prof.function_events:
            if event.device_type == torch.autograd.DeviceType.CUDA:
                times[event.name] += event.time_range.elapsed_us()
                counts[event.name] += 1
        if after is not None:
            after(out)
    return coverage_profile(times, counts, own_names, len(calls))


def coverage_profile(
    times: dict[str, float], calls: dict[str, int], own_names: set[str], repeats: int
) -> Profile:
    total = sum(times.values())
    own = sum(t for name, t in times.items() if name in own_names)
    kernels = sorted(
        (KernelTime(name=n, gpu_time_us=t / repeats, calls=calls[n] // repeats, own=n in own_names)
         for n, t in times.items()),
        key=lambda k: -k.gpu_time_us,
    )
    return Profile(
        coverage=own / total if total > 0 else 0.0,
        meaningful=True,
        total_gpu_time_us=total / repeats,
        own_gpu_time_us=own / repeats,
        kernels=kernels[:TOP_KERNELS],
    )
