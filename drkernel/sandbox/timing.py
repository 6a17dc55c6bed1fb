"""Timing of one side's calls, in its own process: the reference's in the judge, the candidate's in the subject.

On CUDA each call is timed with events on the current stream after a spin on the device that lasts longer than the
host takes to enqueue the flush and the call, then an L2 flush: the start event fires only once the call's kernels
are all queued, so Python launch overhead (large for Triton kernels, small for PyTorch's) never counts, for either
side alike, and the call follows its flush directly, as in do_bench, whatever the spin's length. Before every timed
call no L2 line persists and the persisting carve-out is zero (a kernel that parks its weights in L2 across calls
gains nothing); after it, a changed setting is reported. The judge dictates each side's spin (from that side's
host times so far, `cover_for`: a host-heavy candidate does not lengthen the reference's), alternates the sides trial
by trial and refills the inputs with values never seen before (drkernel.sandbox.judge). The speedup is the
ratio of medians with a bootstrap confidence interval over trials.
"""

from __future__ import annotations

import collections
import gc
import resource
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch

from drkernel.sandbox import audit, correctness
from drkernel.schema import TimingStats

L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times the L2 of any current GPU (H100: 50 MB, H200: 60 MB)

_perf_counter = time.perf_counter  # the harness's own references: a candidate patching time.* changes nothing here
_getrusage = resource.getrusage
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)  # Linux has the thread's own counts


COVER_FACTOR = 3.0  # the device spin lasts this many times the host's typical enqueueing of a call
COVER_MARGIN_MS = 0.25  # and this much more: a microsecond kernel's enqueueing varies by more than itself
COVER_MAX_MS = 20.0  # a call whose host side takes longer than this has its host time counted, as it would in use
PLACEMENTS = 16  # places in GPU memory a small call's inputs and outputs go round, on each side (`Placements`)
PLACED_BYTES = 32 << 20  # a call whose inputs and outputs hold at most this much is small (at most 512 MiB kept)
SLOW_FACTOR = 2.0  # a timed call slower than this many times the side's fastest, plus SLOW_MARGIN_MS, is a slow one
SLOW_MARGIN_MS = 0.005
# A median more than this many times the side's fastest quarter of calls (plus SLOW_MARGIN_MS): part of the calls ran
# beside other work on the GPU. On an H100, 3,752 sides of timed calls had at most 1.031 (small calls); one of a
# 4.3 ms sigmoid had 1.044 with 11 of its 20 calls 9-150% slow, and a speedup 4.2% off (docs/performance.md).
DISTURBED_FACTOR = 1.03
WAIT_CALIBRATION_CALLS = 9  # empty calls that measure the host's wait for an idle device (`CallTimer`)
WAIT_MARGIN_MS = 0.005  # beyond their spread: work on other streams shorter than this goes uncounted
# And never less than this, nor than this share of the call: a host running several evaluations waited 4-7 us more
# than its empty calls in 2 of 3 timed calls of a legitimate kernel, and 11-12 of 20 calls of legitimate 2-3 ms
# level-1 kernels waited 60-100 us more, three evaluations at once on one GPU of a four-GPU host (H200s, 2026-11-28):
# the host's wait grows with the call. Work hidden on other streams below the share gains at most that share.
UNJOINED_FLOOR_MS = 0.05
UNJOINED_SHARE = 0.05


@dataclass
class Samples:
    event_ms: list[float] = field(default_factory=list)  # CUDA: GPU time between events; CPU: wall time per call
    wall_ms: list[float] = field(default_factory=list)  # CUDA: the judge's wall-clock view of each timed call
    host_ms: list[float] = field(default_factory=list)  # each call's host time, enqueueing its start event to its end
    interruptions: list[list[int]] = field(default_factory=list)  # each call's `thread_interruptions` in that time
    driver_allocations: list[int] = field(default_factory=list)  # each call's `CallTimer.driver_allocations`

    @property
    def primary(self) -> list[float]:
        return self.event_ms


def cover_for(host_ms: list[float]) -> float:
    """The device spin (ms) that outlasts the host's enqueueing of a call, from the host times of the side's calls so
    far: their median, which sets aside a call preempted on a busy host (from the slowest warm-up call, on an H100
    beside other evaluations, the candidates' spins came to 6-20 ms against about 1 ms alone, and every timed and
    null call spun that long) and follows a host that is slower throughout (from the fastest, one evaluation of a
    7 us kernel in ten measured 54 us: its enqueueing outlasted the spin in most calls)."""
    return min(COVER_MAX_MS, COVER_FACTOR * statistics.median(host_ms) + COVER_MARGIN_MS) if host_ms else 0.0


class Placements:
    """Where a small call's tensors lie in GPU memory sets its time: on an H100, 40 placements of a 4 MiB input and
    its output gave a 7 us kernel medians with a CV of 1.7%, each placement steady to 0.4% (docs/performance.md). With
    one placement per side and evaluation (the judge's, the subject's), a small task's speedup CV was 2.4-3.1%; going
    round 8 places, 1.0-2.2% in four runs; 16, 1.3-1.4% in two (46b6c34, one process: 1.1-1.6%). Each side keeps the
    tensors of its last PLACEMENTS - 1 calls alive, so that every call's take other blocks and a median spans
    PLACEMENTS placements; `reserve` puts those blocks in the allocator's cache before the first timed call, which then
    never waits for the driver. Larger calls (spread over many pages already) and the CPU keep nothing."""

    def __init__(self, active: bool) -> None:
        self.held: collections.deque[Any] | None = collections.deque(maxlen=PLACEMENTS - 1) if active else None
        audit.pin_methods(self)  # as its class is now: a method swapped on the class later does not reach it

    @classmethod
    def for_call(cls, device: torch.device, values: Any) -> Placements:
        """Active for a call on a GPU whose inputs and outputs (`values`) are small."""
        return cls(device.type == "cuda" and correctness.tensor_bytes(values) <= PLACED_BYTES)

    def reserve(self, values: Any) -> None:
        """Blocks for PLACEMENTS + 1 calls' tensors like those in `values` (the whole storage of one that is a view:
        keeping it keeps that; one more set for the call's own temporaries), made and let go: they stay cached. With
        PLACEMENTS sets of the tensors themselves, 7 of 4,000 timed calls of the RL-shaped batch took a segment from
        the driver on an H100, in tasks that reduce; with these, 1."""
        if self.held is not None:
            made = [torch.empty(t.untyped_storage().nbytes(), dtype=torch.uint8, device=t.device)
                    for _ in range(PLACEMENTS + 1) for t in correctness.tensors_in(values)]
            del made

    def place(self, args: list[Any]) -> list[Any]:
        """The call's inputs in blocks of their own (copies, made before the call), kept with the call."""
        if self.held is None:
            return args
        return [v.clone() if isinstance(v, torch.Tensor) else v for v in args]

    def keep(self, *values: Any) -> None:
        """A call's tensors, held through the next PLACEMENTS - 1 calls."""
        if self.held is not None:
            self.held.append(values)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off, as `timeit` holds it off: one of its full passes takes about
    120 ms in a process with torch and Triton loaded (measured on the CPU), and a pass in the middle of a timed call
    would fall past the device spin into the call's events, or into the judge's wall clock. Restored as found."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def thread_interruptions() -> list[int]:
    """[voluntary context switches, involuntary ones, page faults] of the calling thread so far. Taken around a
    call's enqueueing, they tell a host that blocked in the kernel (a driver call waiting, a lock) from one the
    scheduler preempted, or one faulting memory in: a timed call whose host stalls past the device spin is slow."""
    usage = _getrusage(_RUSAGE_THREAD)
    return [usage.ru_nvcsw, usage.ru_nivcsw, usage.ru_minflt + usage.ru_majflt]


def interruptions_since(before: list[int]) -> list[int]:
    """`thread_interruptions` since `before` (taken by the same thread)."""
    return [now - then for then, now in zip(before, thread_interruptions())]


class CallTimer:
    """Times calls one at a time. On CUDA, each timed call is preceded on the device by a spin (`cover_ms`) that
    outlasts the host's enqueueing of the flush and the call, then by an L2 flush, so the start event fires when the
    call's kernels are already queued: the events see GPU time only."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stream = 0
        self.cover_ms = 0.0
        self.l2_tampered = False  # a persisting-L2 setting was found changed after a call
        self.interruptions = [0, 0, 0]  # `thread_interruptions` while the last timed call was enqueued
        # Segments the caching allocator took from the driver (cudaMalloc) during the last timed call: a call that
        # allocates waits for the driver's lock of the whole host, where slow timed calls were seen blocking.
        self.driver_allocations = 0
        # Work a call left running on other streams past its end event (`_timed`): how long the host waits for the
        # whole device once the timed stream is done, as an empty call measures it, and how much that varies.
        self.idle_wait_ms, self.wait_tolerance_ms = 0.0, 0.0
        self.unjoined_ms = 0.0  # of the last timed call: its work past its end event on other streams, counted
        if self.cuda:
            self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
            self._event = torch.cuda.Event
            self._sync = torch.cuda.synchronize
            self._spin = torch.cuda._sleep
            self.stream = torch.cuda.current_stream().cuda_stream  # the stream the events time
            self._l2 = PersistingL2(self.stream)
            self._cycles_per_ms = self._spin_rate()
            self._calibrate_idle_wait()
        audit.pin_methods(self)  # as its class is now: a method swapped on the class later does not reach it

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

    def _calibrate_idle_wait(self) -> None:
        """`idle_wait_ms` and `wait_tolerance_ms` from empty calls timed as every call is."""
        waits = sorted(self._events_around(_no_call, [])[2] for _ in range(WAIT_CALIBRATION_CALLS))
        self.idle_wait_ms = statistics.median(waits)
        self.wait_tolerance_ms = waits[-1] - self.idle_wait_ms + WAIT_MARGIN_MS

    def timed(self, fn: Callable[..., Any], args: list[Any],
              on_idle: Callable[[], None] | None = None) -> tuple[Any, float, float]:
        """(output, milliseconds of the call, host milliseconds to enqueue it), the device idle on return; `on_idle`
        is told as soon as it is (before this side's own checks)."""
        with collector_paused():
            return self._timed(fn, args, on_idle)

    def _timed(self, fn: Callable[..., Any], args: list[Any],
               on_idle: Callable[[], None] | None) -> tuple[Any, float, float]:
        if not self.cuda:
            before = thread_interruptions()
            start = _perf_counter()
            out = fn(*args)
            elapsed = (_perf_counter() - start) * 1e3
            self.interruptions = interruptions_since(before)
            if on_idle is not None:
                on_idle()
            return out, elapsed, elapsed
        segments = self._segments()  # outside the events and the host's clock, as is the count after
        self._l2.clear()
        out, host_ms, waited_ms, event_ms = self._events_around(fn, args, segments)
        if on_idle is not None:
            on_idle()
        self.l2_tampered |= self._l2.tampered()
        # The end event closes the timed stream only. Work the call started on other streams (its own, cuBLAS, a CUDA
        # graph replayed elsewhere, events arranged so that the timed stream never waits) keeps the device busy after
        # it: past what an empty call waits, the call is timed to the device's idle.
        beyond = max(self.wait_tolerance_ms, UNJOINED_FLOOR_MS, UNJOINED_SHARE * event_ms)
        self.unjoined_ms = max(0.0, waited_ms - self.idle_wait_ms - beyond)
        if self.unjoined_ms:
            event_ms += waited_ms - self.idle_wait_ms
        return out, event_ms, host_ms

    def _events_around(self, fn: Callable[..., Any], args: list[Any], segments: int = 0
                       ) -> tuple[Any, float, float, float]:
        """(output, host ms, wait ms, event ms) of one call between events on the timed stream, after a spin and an
        L2 flush; the wait is the host's for the whole device once the timed stream is done."""
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        if self.cover_ms:
            self._spin(int(self.cover_ms * self._cycles_per_ms))
        self._flush.zero_()  # right before the call, whatever the spin's length, as do_bench flushes
        before = thread_interruptions()  # under the spin, as the host's whole enqueueing is
        host_start = _perf_counter()
        start.record()
        out = fn(*args)
        end.record()
        host_ms = (_perf_counter() - host_start) * 1e3
        self.interruptions = interruptions_since(before)
        self.driver_allocations = self._segments() - segments
        end.synchronize()  # the timed stream is done: an empty device answers the next wait at once
        return out, host_ms, self._wait_for_device(), start.elapsed_time(end)

    def _wait_for_device(self) -> float:
        """Milliseconds the host waits for every stream of this process's device."""
        began = _perf_counter()
        self._sync()
        return (_perf_counter() - began) * 1e3

    def _segments(self) -> int:
        return int(torch.cuda.memory_stats().get("segment.all.allocated", 0))

    def untimed(self, fn: Callable[..., Any], args: list[Any]) -> tuple[Any, float]:
        """A warm-up call and its host enqueue time (for `cover_for`)."""
        with collector_paused():
            start = _perf_counter()
            out = fn(*args)
            return out, (_perf_counter() - start) * 1e3


def _no_call() -> None:
    return None


class PersistingL2:
    """The persisting-L2 controls of this process's CUDA context, through the driver (libcuda, which CUDA itself has
    loaded): the carve-out for persisting lines (kept at zero), the lines marked persisting (reset), the timed
    stream's access-policy window (cleared)."""

    LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
    ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
    VALUE_BYTES = 64  # CUstreamAttrValue: a union of at most 64 bytes

    def __init__(self, stream: int) -> None:
        import ctypes

        self._ctypes = ctypes
        self._driver = ctypes.CDLL("libcuda.so.1")
        self._stream = ctypes.c_void_p(stream)
        self._empty = (ctypes.c_ubyte * self.VALUE_BYTES)()
        self._cleared = False  # the first clear sets everything, whatever was found
        self.clear()

    def clear(self) -> None:
        """No carve-out, no persisting lines, no window. Setting them waits for the device (4 ms a time, measured on
        an H100: a third of a large problem's timing phase), so it is done only when a setting is found changed:
        with no carve-out, no line can persist."""
        if self._cleared and not self.tampered():
            return
        self._driver.cuCtxSetLimit(self.LIMIT_PERSISTING_L2_CACHE_SIZE, self._ctypes.c_size_t(0))
        self._driver.cuCtxResetPersistingL2Cache()
        self._driver.cuStreamSetAttribute(self._stream, self.ATTRIBUTE_ACCESS_POLICY_WINDOW, self._empty)
        self._cleared = True

    def tampered(self) -> bool:
        limit = self._ctypes.c_size_t(0)
        window = (self._ctypes.c_ubyte * self.VALUE_BYTES)()
        self._driver.cuCtxGetLimit(self._ctypes.byref(limit), self.LIMIT_PERSISTING_L2_CACHE_SIZE)
        self._driver.cuStreamGetAttribute(self._stream, self.ATTRIBUTE_ACCESS_POLICY_WINDOW, window)
        return limit.value != 0 or any(window)


def slow(value_ms: float, fastest_ms: float) -> bool:
    """A call slower than SLOW_FACTOR times the side's fastest: on a GPU, one that waited for something else inside
    its events (a fifth of the candidates' medians in an RL run beside other runs' evaluations were such calls;
    docs/miniature.md)."""
    return value_ms > SLOW_FACTOR * fastest_ms + SLOW_MARGIN_MS


def slow_calls(values: list[float]) -> list[int]:
    """The slow calls' indices."""
    fastest = min(values, default=0.0)
    return [i for i, value in enumerate(values) if slow(value, fastest)]


def unsteady(side: str, samples: Samples, spins_ms: list[float]) -> str | None:
    """On CUDA, what to say when a side's median call is a slow one, so that the speedup stands on calls that waited
    (None otherwise); also how many slow calls the host was still enqueueing when the device spin before them ran
    out (`spins_ms`: each call's spin), which tells a host that stalled from a device that was busy. Short of that,
    a median well above the fastest quarter's calls (`disturbed`) is unsteady too."""
    values = samples.primary
    if not values:
        return None
    fastest, median = min(values), statistics.median(values)
    if not slow(median, fastest):
        return disturbed(side, values)
    slowed = slow_calls(values)
    text = (f"{len(slowed)} of the {side}'s {len(values)} timed calls took more than {SLOW_FACTOR:g} times its "
            f"fastest ({fastest:.3g} ms), and its median ({median:.3g} ms) too")
    if samples.host_ms:
        outlasted = sum(1 for i in slowed if i < min(len(samples.host_ms), len(spins_ms))
                        and samples.host_ms[i] > spins_ms[i])
        text += f"; the host was still enqueueing {outlasted} of them when the device spin before them ran out"
    if samples.interruptions:
        seen = [samples.interruptions[i] for i in slowed if i < len(samples.interruptions)]
        blocked, preempted, faulted = (sum(1 for counts in seen if counts[k] > 0) for k in range(3))
        text += (f"; while enqueueing, the host blocked in the kernel in {blocked} of them, was preempted in "
                 f"{preempted} and faulted memory in in {faulted}")
    if samples.driver_allocations:
        allocating = sum(1 for i in slowed if i < len(samples.driver_allocations) and samples.driver_allocations[i])
        text += f"; the allocator took memory from the driver in {allocating} of them"
    return text


def disturbed(side: str, values: list[float]) -> str | None:
    """What to say when the median is more than DISTURBED_FACTOR times the fastest quarter's calls: more than half of
    them were slowed by something beside them, by less than a slow call's factor (None otherwise)."""
    if len(values) < 4:
        return None
    quarter, median = statistics.quantiles(values, n=4, method="inclusive")[0], statistics.median(values)
    if median <= DISTURBED_FACTOR * quarter + SLOW_MARGIN_MS:
        return None
    return (f"the {side}'s median call ({median:.4g} ms) was {100 * (median / quarter - 1):.1f}% slower than its "
            f"fastest quarter of {len(values)} timed calls ({quarter:.4g} ms or less): more than half of them ran "
            "beside other work")


def summarize(samples: Samples, method: str, spin_ms: float | None = None) -> TimingStats:
    values = samples.primary
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) >= 2 else (values[0],) * 3
    return TimingStats(
        median_ms=statistics.median(values),
        iqr_ms=q3 - q1,
        mean_ms=statistics.fmean(values),
        min_ms=min(values),
        trials=len(values),
        method=method,
        wall_median_ms=statistics.median(samples.wall_ms) if samples.wall_ms else None,
        spin_ms=spin_ms if method == "cuda_event" else None,
        samples_ms=list(values),
        host_ms=list(samples.host_ms),
        host_interruptions=[list(counts) for counts in samples.interruptions],
        driver_allocations=list(samples.driver_allocations),
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
