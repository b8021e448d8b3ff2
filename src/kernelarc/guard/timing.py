"""The timing protocol, identical for candidates and references.

Per timed call: outputs re-poisoned, the L2 flushed (a buffer of 2× L2 written), inputs from
a pool of distinct input sets at shifted addresses (moved to new offsets each time the pool
wraps, so no pointer repeats), the device synchronised, then the call measured:

- ``cupti``: the span of all GPU activity (all streams) inside the call, when cupti-python is
  importable (``guard/cupti.py``);
- ``cuda-events``: events on the current stream around the call; the host wall time of
  call + synchronise is kept too, and a call whose wall time exceeds its event time by more
  than 100 µs plus the event time is work escaping the timed region on another stream;
- ``cpu-clock``: ``time.perf_counter_ns`` around the call on the CPU.

Warm-up calls use the same path and are discarded. Figures: median and spread (p10/p90).
What this does not cover: with CUDA events, escapes shorter than 100 µs go unseen (CUPTI
sees them); CPU timings are noisy at the microsecond level.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ESCAPE_SLACK_MS = 0.1


@dataclass
class TimingResult:
    method: str
    samples_ms: list[float]
    wall_ms: list[float] = field(default_factory=list)
    escaped: bool = False
    escape_detail: str = ""

    def summary(self) -> dict[str, Any]:
        s = sorted(self.samples_ms)
        n = len(s)
        return {
            "method": self.method,
            "median_ms": statistics.median(s),
            "p10_ms": s[int(0.1 * (n - 1))],
            "p90_ms": s[int(0.9 * (n - 1))],
            "min_ms": s[0],
            "n": n,
        }


def shifted_copy(t: Any, shift_elems: int) -> Any:
    """A copy of ``t`` whose data starts ``shift_elems`` elements into a fresh allocation."""
    import torch

    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return t
    flat = torch.empty(t.numel() + shift_elems, dtype=t.dtype, device=t.device)
    view = flat[shift_elems:].view(t.shape)
    view.copy_(t)
    return view


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


class Flusher:
    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        if device.type == "cuda":
            l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
            size = 2 * max(l2, 32 << 20)
        else:
            size = 64 << 20
        self.buf = torch.empty(size, dtype=torch.uint8, device=device)
        self.i = 0

    def __call__(self) -> None:
        self.i += 1
        self.buf.fill_(self.i & 0xFF)


def time_calls(
    call: Callable[[int], Any],
    before: Callable[[int], None],
    *,
    warmup: int,
    iterations: int,
    device: Any,
    use_cupti: bool,
) -> TimingResult:
    """Time ``call(i)`` for i in range(warmup + iterations); ``before(i)`` runs untimed first."""
    import torch

    flush = Flusher(device)
    cuda = device.type == "cuda"
    method = "cupti" if (cuda and use_cupti) else ("cuda-events" if cuda else "cpu-clock")
    samples: list[float] = []
    walls: list[float] = []
    span = None
    if method == "cupti":
        from kernelarc.guard.cupti import ActivitySpan

        span = ActivitySpan()
    start = torch.cuda.Event(enable_timing=True) if cuda else None
    end = torch.cuda.Event(enable_timing=True) if cuda else None
    for i in range(warmup + iterations):
        before(i)
        flush()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter_ns()
        if span is not None:
            assert start is not None and end is not None
            with span:
                start.record()
                call(i)
                end.record()
                torch.cuda.synchronize(device)
            ms = span.span_ms
            wall = start.elapsed_time(end)  # the current stream only: compared below
        elif cuda:
            assert start is not None and end is not None
            start.record()
            call(i)
            end.record()
            torch.cuda.synchronize(device)
            ms = start.elapsed_time(end)
        else:
            call(i)
            ms = (time.perf_counter_ns() - t0) / 1e6
        if span is None:
            wall = (time.perf_counter_ns() - t0) / 1e6
        if i >= warmup:
            samples.append(ms)
            walls.append(wall)
    result = TimingResult(method, samples, walls)
    # Work that outlives the caller's stream by far ran on a stream the caller never
    # waited for. CUPTI: all-stream span vs events on the caller's stream; events: host wall
    # time of call + synchronise vs events.
    if method == "cupti":
        _check_escape(result, caller_ms=walls, all_ms=samples, what="GPU activity")
    elif method == "cuda-events":
        _check_escape(result, caller_ms=samples, all_ms=walls, what="wall time")
    return result


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


def pool_size(input_bytes: int, calls: int, device: Any) -> int:
    """How many distinct input sets to keep: all calls when they fit in a memory budget
    (a fifth of free device memory, at most 2 GiB; 1 GiB on the CPU), at least 2."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = min(2 << 30, free // 5)
    else:
        budget = 1 << 30
    per = max(int(input_bytes), 1)
    return int(max(2, min(calls, budget // per)))


def tensor_bytes(values: Sequence[Any]) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
