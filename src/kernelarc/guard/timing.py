"""The timing protocol, identical for candidates and references.

Per timed call: outputs re-poisoned, the L2 flushed (2× L2 written, on CUDA rotating through
a few windows of one buffer: see ``Flusher``), inputs from a pool of distinct input sets at
shifted addresses (moved to new offsets each time the pool wraps, so no pointer repeats),
the device synchronised, then the call measured:

- ``cupti``: the span of all GPU activity (all streams) inside the call, when cupti-python is
  importable (``guard/cupti.py``): calls bracketed by marker kernels on a private stream,
  CUPTI enabled once and flushed once for the whole loop (``cupti-per-call``, a flush after
  every call, only where the markers cannot be told apart);
- ``cuda-events``: events on the current stream around the call; the host wall time of
  call + synchronise is kept too, and a call whose wall time exceeds its event time by more
  than 100 µs plus the event time is work escaping the timed region on another stream;
- ``cpu-clock``: ``time.perf_counter_ns`` around the call on the CPU.

On CUDA every tensor of a pool smaller than ``PLACEMENT_BYTES`` gets an allocation of its own
that large (its own physical pages): the latency of a microsecond kernel depends on where its
tensors lie in device memory (one H200 process, a 2.3 µs RMSNorm at 12 placements: medians
2.21-2.40 µs, each placement repeating), and a pool packed into a few allocator segments
gave every process one placement, so whole evaluations sat ~60 ns apart. Spread over the
pool's sets, each process averages over many placements.

Warm-up calls use the same path and are discarded. Figures: median and spread (p10/p90).
What this does not cover: with CUDA events, escapes shorter than 100 µs go unseen (CUPTI
sees them); CPU timings are noisy at the microsecond level.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelarc.guard.cupti import ActivitySpan, CallLog
from kernelarc.guard.held_memory import CycleCollector

ESCAPE_SLACK_MS = 0.1


@dataclass
class TimingResult:
    method: str
    samples_ms: list[float]
    wall_ms: list[float] = field(default_factory=list)
    escaped: bool = False
    escape_detail: str = ""
    calls: int = 0
    """Calls made in all, warm-up included (more than asked when extended; see time_calls)."""

    def summary(self) -> dict[str, Any]:
        s = sorted(self.samples_ms)
        n = len(s)
        return {
            "method": self.method,
            "median_ms": statistics.median(s),
            # Mean of the middle half: as robust as the median, and it resolves changes
            # smaller than the GPU timer's tick (the median of a 2 µs kernel moves in 32 ns
            # steps, ~1.5%).
            "iqm_ms": statistics.fmean(s[n // 4 : n - n // 4] or s),
            # The median read between the timer's ticks (diagnostic; the verdict's latency is
            # the plain median): see ``tick_median``.
            "median_interp_ms": tick_median(s),
            "p10_ms": s[int(0.1 * (n - 1))],
            "p90_ms": s[int(0.9 * (n - 1))],
            "min_ms": s[0],
            "n": n,
            **self._cross_check(),
        }

    def _cross_check(self) -> dict[str, float]:
        """The median of the second series the escape check compares against: the
        caller-stream events under CUPTI, the host wall time under CUDA events."""
        if not self.wall_ms:
            return {}
        if self.method.startswith("cupti"):
            return {"caller_stream_median_ms": statistics.median(self.wall_ms)}
        if self.method == "cuda-events":
            return {"host_wall_median_ms": statistics.median(self.wall_ms)}
        return {}


#: On CUDA, the smallest allocation a timing-pool tensor gets: the GPU's large page, so that
#: the pool's small tensors lie on distinct physical pages (see the module docstring).
PLACEMENT_BYTES = 2 << 20


def placed_elems(numel: int, itemsize: int, device: Any) -> int:
    """Elements to allocate for a pool tensor of ``numel`` elements (shift included)."""
    if getattr(device, "type", None) == "cuda":
        return max(numel, -(-PLACEMENT_BYTES // itemsize))
    return numel


def tick_median(sorted_ms: Sequence[float]) -> float:
    """The median of samples read on a coarse clock, interpolated within the tick that holds
    it (the grouped-data median: ``v - w/2 + w * (n/2 - below) / at``, ``v`` the median's
    tick value, ``w`` the tick, ``below``/``at`` the samples under / on ``v``). A plain median
    of a 2.3 µs kernel timed in 32 ns ticks jumps a whole tick (1.4%) when the distribution
    moves a little; this moves with it. Samples that are not quantised (fewer than 4 samples
    per distinct value, or gaps that are not whole ticks) get the plain median."""
    s = list(sorted_ms)
    n = len(s)
    med = statistics.median(s)  # no samples: raises, as the plain median does
    values = sorted(set(s))
    if n < 8 or len(values) < 2 or len(values) * 4 > n:
        return med
    w = min(b - a for a, b in zip(values, values[1:], strict=False))
    if w <= 0 or any(
        abs((b - a) / w - round((b - a) / w)) > 0.05
        for a, b in zip(values, values[1:], strict=False)
    ):
        return med
    v = s[(n - 1) // 2]
    below = sum(1 for x in s if x < v - w / 2)
    at = sum(1 for x in s if abs(x - v) <= w / 2)
    return v - w / 2 + w * (n / 2 - below) / at


def shifted_copy(t: Any, shift_elems: int) -> Any:
    """A copy of ``t`` whose data starts ``shift_elems`` elements into a fresh allocation (on
    CUDA at least ``PLACEMENT_BYTES`` large)."""
    import torch

    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return t
    n = placed_elems(t.numel() + shift_elems, t.element_size(), t.device)
    flat = torch.empty(n, dtype=t.dtype, device=t.device)
    view = flat[shift_elems : shift_elems + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def pool_shift(cycle: int) -> int:
    """Elements into their allocations that a timing pool's tensors start at: 64 when the
    pool is built (``cycle`` 0), then another offset each time the calls wrap around it, so
    no pointer repeats. Both workers place their pools by this rule: the same allocations
    read a kernel a few percent apart at different offsets (docs/PERFORMANCE.md), so a
    reference placed otherwise than its candidates would be timed on other terms."""
    return 64 * (1 + cycle % 32)


def shifted_values(values: list[Any], shift: int) -> list[Any]:
    """``values`` with every tensor moved to a fresh allocation ``shift`` elements in, one at
    a time (the list is changed in place, and each old tensor is freed before the next is
    copied when nothing else holds it: an input set of tens of GB needs one tensor's size
    more, not its own)."""
    for n, t in enumerate(values):
        values[n] = None
        values[n] = shifted_copy(t, shift)
        del t
    return values


def timing_pool(
    make: Callable[[int], list[Any]], seeds: Sequence[int], calls: int, device: Any, cap: int
) -> list[list[Any]]:
    """The distinct input sets a timing loop cycles through (``make(seed)`` builds one), as
    many as :func:`pool_size` allows, each placed at :func:`pool_shift` (0). The reference
    worker and the candidate worker both build their pools here."""
    first = shifted_values(make(int(seeds[0])), pool_shift(0))
    n = pool_size(tensor_bytes(first), min(calls, len(seeds)), device, cap=cap)
    return [first] + [shifted_values(make(int(s)), pool_shift(0)) for s in seeds[1:n]]


def move_pool(pool: list[list[Any]], cycle: int) -> None:
    """Move every set of ``pool`` to :func:`pool_shift` (``cycle``), one tensor at a time
    (done by both workers before the first call of each new pass over their pool: call
    ``cycle * len(pool)``)."""
    for j, entry in enumerate(pool):
        pool[j] = shifted_values(entry, pool_shift(cycle))


def placed(values: Sequence[Any]) -> list[Any]:
    """``values`` with every CUDA tensor smaller than ``PLACEMENT_BYTES`` copied into an
    allocation of its own that large; larger tensors and everything else as they are (a
    pool of tens of GB is not copied)."""
    import torch

    return [
        shifted_copy(v, 0)
        if isinstance(v, torch.Tensor)
        and v.device.type == "cuda"
        and v.numel() * v.element_size() < PLACEMENT_BYTES
        else v
        for v in values
    ]


def poison(t: Any) -> None:
    """Fill an output buffer with a value no correct kernel leaves behind."""
    import torch

    if t.dtype.is_floating_point:
        if t.dtype.itemsize == 1:
            t.view(torch.uint8).fill_(0x7F)  # NaN in e4m3fn, a huge value in e5m2
        else:
            t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.view(torch.uint8).fill_(0xA5)
    else:
        t.view(torch.uint8).fill_(0xA5)


#: On CUDA, how many flush windows the flush rotates through (fewer where memory is short).
FLUSH_WINDOWS = 4


class Flusher:
    """Writes twice the L2's size before every timed call, so no call finds its data cached.

    On CUDA the write rotates through ``windows`` windows of one buffer of
    ``(windows + 1) x L2`` bytes, window ``k`` covering ``[k L2, (k + 2) L2)``: the last L2's
    worth written, what the L2 holds (dirty) when the call starts, is a different part of
    device memory for each window. Where that part lies moves a microsecond kernel by a
    few percent (docs/PERFORMANCE.md), and a single buffer gave every process (every
    evaluation) one placement. Rotating averages each process over several. The CPU keeps
    one 64 MiB buffer."""

    def __init__(self, device: Any, windows: int = 0) -> None:
        import torch

        self.device = device
        if device.type == "cuda":
            l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
            self.span = max(l2, 32 << 20)
            if windows <= 0:  # as many as FLUSH_WINDOWS while the buffer stays under 1/16
                free, _ = torch.cuda.mem_get_info(device)
                fit = free // (16 * self.span) - 1
                windows = max(1, min(FLUSH_WINDOWS, int(fit)))
            self.size = 2 * self.span
            total = (windows + 1) * self.span
        else:
            self.span = self.size = total = 64 << 20
            windows = 1
        self.windows = windows
        self.buf = torch.empty(total, dtype=torch.uint8, device=device)
        self.i = 0

    def window(self, i: int) -> tuple[int, int]:
        """The byte range the ``i``-th flush writes."""
        start = (i % self.windows) * self.span if self.windows > 1 else 0
        return start, start + self.size

    def __call__(self) -> None:
        self.i += 1
        lo, hi = self.window(self.i)
        self.buf[lo:hi].fill_(self.i & 0xFF)


def time_calls(
    call: Callable[[int], Any],
    before: Callable[[int], None],
    *,
    warmup: int,
    iterations: int,
    device: Any,
    use_cupti: bool,
    min_timed_ms: float = 0.0,
    max_iterations: int = 0,
    max_timed_ms: float = 0.0,
    keep: Callable[[int, Any], None] | None = None,
) -> TimingResult:
    """Time ``call(i)`` for i in range(warmup + n); ``before(i)`` runs untimed first, and
    ``keep(i, result)`` (if given) untimed after: the caller's bookkeeping stays out of the
    timed region, which holds the call alone.

    ``n`` is ``iterations``, raised (up to ``max_iterations``) when the median of the warm-up
    calls says that ``iterations`` calls would measure less than ``min_timed_ms`` in all:
    the median of a few-microsecond kernel needs more samples to repeat within 1-2%; and
    lowered (to no fewer than ``MIN_ITERATIONS``) when they would measure more than
    ``max_timed_ms``: a call of hundreds of milliseconds repeats well in a few samples."""
    cuda = device.type == "cuda"
    method = "cupti" if (cuda and use_cupti) else ("cuda-events" if cuda else "cpu-clock")
    extend = _Extend(iterations, min_timed_ms, max_iterations, max_timed_ms)
    loop = _Loop(call, before, device, Flusher(device), keep=keep)
    if method == "cupti":
        method = _run_cupti(loop, warmup, extend)
    else:
        loop.run(warmup, extend)
    result = TimingResult(method, loop.samples, loop.walls, calls=loop.calls)
    # Work that outlives the caller's stream by far ran on a stream the caller never
    # waited for. CUPTI: all-stream span vs events on the caller's stream; events: host wall
    # time of call + synchronise vs events.
    if method.startswith("cupti"):
        _check_escape(result, caller_ms=loop.walls, all_ms=loop.samples, what="GPU activity")
    elif method == "cuda-events":
        _check_escape(result, caller_ms=loop.samples, all_ms=loop.walls, what="wall time")
    return result


def _run_cupti(loop: _Loop, warmup: int, extend: _Extend) -> str:
    """Run ``loop`` under CUPTI; the method name used. Marker-bracketed calls with one flush
    (``cupti``) where the markers can be told apart, else a flush per call
    (``cupti-per-call``, slower on the host; the reason is printed to the worker's log)."""
    with contextlib.ExitStack() as stack:
        try:
            log = stack.enter_context(CallLog())
        except RuntimeError as e:
            print(f"kernelarc: CUPTI call log unavailable ({e}); one flush per call")
            loop.span = ActivitySpan()
            with loop.span.session():
                loop.run(warmup, extend)
            return "cupti-per-call"
        loop.log = log
        loop.run(warmup, extend)
    if any(ms is None for ms in log.spans_ms):
        raise RuntimeError(
            "no GPU activity (kernel, memcpy or memset) was recorded inside the span: "
            "the timed call launched nothing on the GPU"
        )
    loop.samples = [float(ms) for ms in log.spans_ms[warmup:] if ms is not None]
    return "cupti"


#: Fewest timed calls when ``max_timed_ms`` shortens the timing of a slow call.
MIN_ITERATIONS = 10


@dataclass(frozen=True)
class _Extend:
    iterations: int
    min_timed_ms: float
    max_iterations: int
    max_timed_ms: float = 0.0

    def count(self, warm_ms: list[float]) -> int:
        if not warm_ms:
            return self.iterations
        est = max(statistics.median(warm_ms), 1e-6)
        if self.max_timed_ms > 0 and est * self.iterations > self.max_timed_ms:
            return max(min(MIN_ITERATIONS, self.iterations), math.ceil(self.max_timed_ms / est))
        if self.min_timed_ms <= 0 or self.max_iterations <= self.iterations:
            return self.iterations
        return max(self.iterations, min(self.max_iterations, math.ceil(self.min_timed_ms / est)))


@dataclass
class _Loop:
    """The calls themselves. With a CUPTI :class:`~kernelarc.guard.cupti.CallLog` the
    samples are filled in afterwards from its spans (the warm-up's are read when it ends,
    for the timed-call count); ``walls`` are then the caller-stream event times (the escape
    check uses them)."""

    call: Callable[[int], Any]
    before: Callable[[int], None]
    device: Any
    flush: Flusher
    keep: Callable[[int, Any], None] | None = None
    log: Any = None
    span: Any = None
    samples: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    calls: int = 0

    def run(self, warmup: int, extend: _Extend) -> None:
        import torch

        cuda = self.device.type == "cuda"
        start = torch.cuda.Event(enable_timing=True) if cuda else None
        end = torch.cuda.Event(enable_timing=True) if cuda else None
        warm: list[float] = []
        total = warmup + extend.iterations
        # With a call log the estimate is read one call early: the peek's flush delays the
        # next call, which must then be a warm-up call.
        last_warm = warmup - 2 if self.log is not None and warmup >= 2 else warmup - 1
        collect = CycleCollector(self.device)
        i = 0
        while i < total:
            self.before(i)
            self.flush()
            if cuda:
                torch.cuda.synchronize(self.device)
            if self.log is not None:
                self.log.begin()
            t0 = time.perf_counter_ns()
            if self.span is not None:
                assert start is not None and end is not None
                with self.span:
                    start.record()
                    ret = self.call(i)
                    end.record()
                    torch.cuda.synchronize(self.device)
                ms, wall = self.span.span_ms, start.elapsed_time(end)
            elif cuda:
                assert start is not None and end is not None
                start.record()
                ret = self.call(i)
                end.record()
                torch.cuda.synchronize(self.device)
                wall_ns = time.perf_counter_ns() - t0
                if self.log is not None:
                    self.log.end()
                    ms = wall = start.elapsed_time(end)  # the caller's stream only
                else:
                    ms, wall = start.elapsed_time(end), wall_ns / 1e6
            else:
                ret = self.call(i)
                ms = wall = (time.perf_counter_ns() - t0) / 1e6
            if self.keep is not None:
                self.keep(i, ret)
            del ret  # released after the measurement: freeing outputs is not the call's time
            if i == 0:  # a first call that compiled leaves garbage cycles holding tensors
                collect()
            if i >= warmup:
                self.samples.append(ms)
                self.walls.append(wall)
            else:
                warm.append(ms)
                if i == last_warm:
                    total = warmup + extend.count(self._warm_estimate(warm))
            i += 1
        self.calls = total

    def _warm_estimate(self, warm: list[float]) -> list[float]:
        """The warm-up times the timed-call count is estimated from. With a call log these
        are its CUPTI spans, the quantity the samples will hold: the caller-stream event
        times also hold the host's launch gaps (tens of microseconds around a kernel of
        two), which made tiny kernels get a tenth of the calls ``min_timed_ms`` asks for.
        The event times where the log recorded no span."""
        if self.log is None:
            return warm
        spans = [ms for ms in self.log.peek() if ms is not None]
        return spans if spans else warm


def _check_escape(
    result: TimingResult, *, caller_ms: list[float], all_ms: list[float], what: str
) -> None:
    gap = statistics.median(a - c for c, a in zip(caller_ms, all_ms, strict=True))
    med = statistics.median(caller_ms)
    if gap > ESCAPE_SLACK_MS + med:
        result.escaped = True
        result.escape_detail = (
            f"{gap + med:.3f} ms of {what} but only {med:.3f} ms on the calling stream: "
            "work escaped the timed region onto a stream the call never joined"
        )


def pool_size(input_bytes: int, calls: int, device: Any, cap: int = 0) -> int:
    """How many distinct input sets to keep: all calls when they fit in a memory budget
    (a fifth of free device memory, at most 2 GiB; 1 GiB on the CPU), at least 2 — except
    when a second set would take over a quarter of the free device memory (half on the CPU;
    inputs of tens of GB): then one, moved to a new address before every call (pointers
    still never repeat, but a result cached by the inputs' content is not defeated, see
    docs/GUARD.md). A quarter on a GPU because the other worker shares it: at half, a
    second set of tens of GB was allowed beside the other worker's own. ``cap`` (when
    positive) is the most sets kept."""
    import torch

    per = max(int(input_bytes), 1)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget, share = min(2 << 30, free // 5), 4
    else:
        free = _host_available()
        budget, share = 1 << 30, 2
    if free and per > free // share:
        return 1
    n = int(max(2, min(calls, budget // per)))
    return min(n, cap) if cap > 0 else n


def _host_available() -> int:
    """Bytes of host memory available (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def tensor_bytes(values: Sequence[Any]) -> int:
    """Bytes the tensors of ``values`` take in a timing pool (placement padding included)."""
    import torch

    return sum(
        placed_elems(v.numel(), v.element_size(), v.device) * v.element_size()
        for v in values
        if isinstance(v, torch.Tensor)
    )
