"""Timing of reference and candidate, interleaved in one process on one device.

On CUDA each call is timed with events on the current stream after a spin on the device that lasts longer than the
host takes to enqueue the flush and the call, then an L2 flush: the start event fires only once the call's kernels
are all queued, so Python launch overhead (large for Triton kernels, small for PyTorch's) never counts, for either
side alike, and the call follows its flush directly, as in do_bench, whatever the spin's length. Every timed call
gets input values never seen before, written into the same buffers before the flush (outside the timed
window), so no memo keyed on contents, pointers, versions, shapes or call counts can answer from memory; the outputs
are checked after the window. A few host-synchronized calls per side add the wall time until the device is idle,
which exposes work hidden on other streams. The order of reference and candidate alternates between trials so that
drift hits both alike. The speedup is the ratio of medians with a bootstrap confidence interval over trials.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from drkernel.schema import TimingStats

L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times the L2 of any current GPU (H100: 50 MB, H200: 60 MB)

_perf_counter = time.perf_counter  # the harness's own references: a candidate patching time.* changes nothing here


SYNCED_CALLS = 3  # host-synchronized calls per side, to compare events with wall time
COVER_FACTOR = 3.0  # the device spin lasts this many times the slowest host enqueue seen in the warm-up
COVER_MARGIN_MS = 0.05
COVER_MAX_MS = 20.0  # a call whose host side takes longer than this has its host time counted, as it would in use


@dataclass
class Samples:
    event_ms: list[float] = field(default_factory=list)  # CUDA: pipelined calls, GPU time between events
    wall_ms: list[float] = field(default_factory=list)  # CPU: wall time per call; CUDA: host-synchronized calls
    synced_event_ms: list[float] = field(default_factory=list)  # CUDA: events of the host-synchronized calls
    host_ms: list[float] = field(default_factory=list)  # CUDA: host time to enqueue each timed call
    pending: list[tuple[Any, Any]] = field(default_factory=list, repr=False)

    @property
    def primary(self) -> list[float]:
        return self.event_ms or self.wall_ms


class CallTimer:
    """Times calls. On CUDA, each timed call is preceded on the device by a spin (`cover_ms`) that outlasts the
    host's enqueueing of the flush and the call, then by an L2 flush, so the start event fires when the call's
    kernels are already queued: the events see GPU time only, whether the device was idle or busy when the call
    began."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stream = 0
        self.cover_ms = 0.0
        if self.cuda:
            self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
            self._event = torch.cuda.Event
            self._sync = torch.cuda.synchronize
            self._spin = torch.cuda._sleep
            self.stream = torch.cuda.current_stream().cuda_stream  # the stream the events time
            self._cycles_per_ms = self._spin_rate()

    def _spin_rate(self) -> float:
        """Device clock cycles per millisecond of `torch.cuda._sleep`, measured (the clock varies by GPU)."""
        cycles = 1 << 21
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        self._spin(cycles)  # first launch loads the kernel
        start.record()
        self._spin(cycles)
        end.record()
        self._sync()
        return cycles / max(start.elapsed_time(end), 1e-3)

    def cover(self, host_ms: list[float]) -> None:
        """Set the device spin from the host enqueue times of untimed calls of both sides."""
        if host_ms:
            self.cover_ms = min(COVER_MAX_MS, COVER_FACTOR * max(host_ms) + COVER_MARGIN_MS)

    def enqueue(self, fn: Callable[..., Any], args: list[Any], samples: Samples) -> Any:
        if not self.cuda:
            start = _perf_counter()
            out = fn(*args)
            samples.wall_ms.append((_perf_counter() - start) * 1e3)
            return out
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        if self.cover_ms:
            self._spin(int(self.cover_ms * self._cycles_per_ms))
        self._flush.zero_()  # right before the call, whatever the spin's length, as do_bench flushes
        host_start = _perf_counter()
        start.record()
        out = fn(*args)
        end.record()
        samples.host_ms.append((_perf_counter() - host_start) * 1e3)
        samples.pending.append((start, end))
        return out

    def untimed(self, fn: Callable[..., Any], args: list[Any], host_ms: list[float]) -> Any:
        """A warm-up call; on CUDA, its host enqueue time is recorded for `cover`."""
        start = _perf_counter()
        out = fn(*args)
        host_ms.append((_perf_counter() - start) * 1e3)
        return out

    def collect(self, samples: Samples) -> None:
        """Wait for the enqueued calls and read their events."""
        if self.cuda:
            self._sync()
            samples.event_ms += [start.elapsed_time(end) for start, end in samples.pending]
            samples.pending.clear()

    def synced(self, fn: Callable[..., Any], args: list[Any], samples: Samples) -> None:
        """One call timed both by events and by the host clock until the whole device is idle."""
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        self._flush.zero_()
        self._sync()
        wall_start = _perf_counter()
        start.record()
        fn(*args)
        end.record()
        self._sync()
        samples.wall_ms.append((_perf_counter() - wall_start) * 1e3)
        samples.synced_event_ms.append(start.elapsed_time(end))


def time_interleaved(
    timer: CallTimer,
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    fresh_args: Callable[[], list[Any]],
    trials: int,
    warmup: int,
    on_outputs: Callable[[int, Any, Any], None] | None = None,
) -> tuple[Samples, Samples]:
    """Time both sides `trials` times, alternating which goes first. `fresh_args()` is called before every call
    pair (warm-up, timed and host-synchronized alike) and must give inputs with values never used before; both sides
    of a trial see the same ones. `on_outputs(trial, ref_out, cand_out)` checks a trial's outputs after its timed
    window. On CUDA, a few host-synchronized calls per side follow."""
    host_ms: list[float] = []
    for _ in range(warmup):
        args = fresh_args()
        timer.untimed(reference, args, host_ms)
        timer.untimed(candidate, args, host_ms)
    timer.cover(host_ms[2:] or host_ms)  # the first pair may still compile or autotune
    ref, cand = Samples(), Samples()
    for trial in range(trials):
        args = fresh_args()
        if trial % 2 == 0:
            ref_out = timer.enqueue(reference, args, ref)
            cand_out = timer.enqueue(candidate, args, cand)
        else:
            cand_out = timer.enqueue(candidate, args, cand)
            ref_out = timer.enqueue(reference, args, ref)
        if on_outputs is not None:
            on_outputs(trial, ref_out, cand_out)
        del ref_out, cand_out
    timer.collect(ref)
    timer.collect(cand)
    if timer.cuda:
        for _ in range(SYNCED_CALLS):
            args = fresh_args()
            timer.synced(reference, args, ref)
            timer.synced(candidate, args, cand)
    return ref, cand


def summarize(samples: Samples, method: str) -> TimingStats:
    values = samples.primary
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) >= 2 else (values[0],) * 3
    return TimingStats(
        median_ms=statistics.median(values),
        iqr_ms=q3 - q1,
        mean_ms=statistics.fmean(values),
        min_ms=min(values),
        trials=len(values),
        method=method,
        wall_median_ms=statistics.median(samples.wall_ms) if samples.event_ms else None,
    )


def speedup_interval(ref_ms: list[float], cand_ms: list[float], seed: int, resamples: int = 2000) -> list[float]:
    """95% bootstrap interval of median(ref) / median(cand), resampling the paired trials."""
    ref, cand = np.asarray(ref_ms), np.asarray(cand_ms)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ref), size=(resamples, len(ref)))
    ratios = np.median(ref[idx], axis=1) / np.median(cand[idx], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return [float(low), float(high)]


def measure_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written (the best of a few copies)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(repeats):
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    return nbytes / best
