"""Tests of CUPTI activity timing (kernelarc.guard.cupti).

Without CUDA only the probe and the errors can be checked; the GPU tests need a CUDA device
and cupti-python, and are skipped otherwise.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernelarc.guard.cupti import (
    ActivitySpan,
    CuptiUnavailable,
    cupti_available,
    cupti_unavailable_reason,
)

HAS_CUDA = torch.cuda.is_available()
HAS_CUPTI_PKG = importlib.util.find_spec("cupti") is not None


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA answer")
def test_unavailable_without_cuda() -> None:
    assert cupti_available() is False
    reason = cupti_unavailable_reason()
    assert reason is not None
    assert ("cupti-python" in reason) if not HAS_CUPTI_PKG else ("CUDA" in reason)


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA answer")
def test_entering_a_span_without_cupti_raises_clearly() -> None:
    span = ActivitySpan()
    with pytest.raises(CuptiUnavailable, match="unavailable"), span:
        pass


gpu = pytest.mark.skipif(
    not (HAS_CUDA and HAS_CUPTI_PKG), reason="needs a CUDA device and cupti-python"
)


@pytest.mark.gpu
@gpu
def test_matmul_span() -> None:
    assert cupti_available()
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    span = ActivitySpan()
    with span:
        a @ b
    first = span.span_ms
    names = span.kernel_names
    assert first > 0
    assert names and all(names)
    # reusable: a second block starts empty and sees the same kernels
    with span:
        a @ b
    assert span.kernel_names == names
    assert span.span_ms > 0
    with span:
        for _ in range(4):
            a @ b
    assert len(span.kernel_names) == 4 * len(names)
    assert span.span_ms > 2 * first


@pytest.mark.gpu
@gpu
def test_side_stream_work_is_in_the_span() -> None:
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    span = ActivitySpan()
    with span, torch.cuda.stream(side):
        for _ in range(3):
            a @ a
    side_only = span.span_ms
    assert side_only > 0 and span.kernel_names

    x = torch.zeros(16, device="cuda")
    with span:
        x.add_(1)  # tiny kernel on the default stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                a @ a
    names = span.kernel_names
    assert len(names) >= 2
    assert span.span_ms >= 0.8 * side_only


@pytest.mark.gpu
@gpu
def test_memcpy_and_memset_count() -> None:
    host = torch.randn(1 << 24).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    span = ActivitySpan()
    with span:
        dev.copy_(host, non_blocking=True)
    assert span.span_ms > 0
    assert any(r.kind == "memcpy" for r in span.records)
    assert span.kernel_names == []


@pytest.mark.gpu
@gpu
def test_no_activity_raises() -> None:
    span = ActivitySpan()
    with span:
        pass
    with pytest.raises(RuntimeError, match="no GPU activity"):
        _ = span.span_ms


@pytest.mark.gpu
@gpu
def test_call_log_brackets_each_call() -> None:
    from kernelarc.guard.cupti import CallLog

    x = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    with CallLog() as log:
        for i in range(6):
            log.begin()
            if i % 2:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    torch.cuda._sleep(1_000_000)
                    x.mul_(1.0)
            else:
                x.mul_(1.0)
            torch.cuda.synchronize()
            log.end()
    assert len(log.spans_ms) == 6 and all(s is not None for s in log.spans_ms)
    spans = [float(s or 0.0) for s in log.spans_ms]
    short = [s for i, s in enumerate(spans) if i % 2 == 0]
    long = [s for i, s in enumerate(spans) if i % 2]
    assert max(short) < min(long)  # side-stream work counts for its own call only


@pytest.mark.gpu
@gpu
def test_call_log_peek_reads_the_calls_so_far_and_keeps_them() -> None:
    from kernelarc.guard.cupti import CallLog

    x = torch.randn(1 << 20, device="cuda")
    with CallLog() as log:
        for i in range(5):
            log.begin()
            x.mul_(1.0)
            torch.cuda.synchronize()
            log.end()
            if i == 2:
                early = log.peek()
    assert len(early) == 3 and all(s is not None for s in early)
    assert len(log.spans_ms) == 5 and log.spans_ms[:3] == early


def test_call_log_partitions_records_between_markers() -> None:
    """The partition itself, on constructed records (no GPU): a call's records are those
    whose correlation id lies between its two markers (stream 7 here), whatever stream or
    order they arrive in; work between calls (the L2 flush) counts for none."""
    from kernelarc.guard.cupti import ActivityRecord, CallLog

    def rec(cid: int, start: int, end: int, stream: int | None) -> ActivityRecord:
        kind = "kernel" if stream is not None else "memcpy"
        return ActivityRecord(kind, start, end, cid, "k", stream)

    log = CallLog()
    log._sid, log._n = 7, 2
    records = [
        rec(5, 0, 10_000, 3),  # before the first marker: the flush
        rec(20, 900_000, 901_000, 7),  # call 0 markers: 10, 20
        rec(10, 100_000, 100_500, 7),
        rec(12, 200_000, 203_000, 3),
        rec(15, 250_000, 1_250_000, 4),  # a side stream counts
        rec(25, 950_000, 960_000, 3),  # between calls
        rec(30, 2_000_000, 2_000_100, 7),  # call 1: nothing inside
        rec(31, 2_100_000, 2_100_100, 7),
    ]
    assert log._partition(records) == [pytest.approx(1.05), None]
    log._n = 3
    with pytest.raises(RuntimeError, match="marker records"):
        log._partition(records)
