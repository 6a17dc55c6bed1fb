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


def profile_cuda(call: Callable[[], Any], own_names: set[str], repeats: int = 3) -> Profile:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    times: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.time_range.elapsed_us()
            calls[event.name] += 1
    return coverage_profile(times, calls, own_names, repeats)


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
