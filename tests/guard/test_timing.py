"""The timing loop (kernelarc.guard.timing) on the CPU: call counts, the extension of the
timed calls for fast kernels, the escape rule, where pool tensors are placed (on the GPU:
small tensors on pages of their own) and the flush's windows. GPU timing methods are covered by
tests/test_cupti.py and the H200 benchmarks, not here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernelarc.guard.timing import (
    FLUSH_WINDOWS,
    PLACEMENT_BYTES,
    Flusher,
    TimingResult,
    _check_escape,
    _Extend,
    _Loop,
    placed,
    placed_elems,
    shifted_copy,
    tensor_bytes,
    tick_median,
    time_calls,
)


def _run(**kw: object) -> tuple[TimingResult, list[int]]:
    seen: list[int] = []
    x = torch.ones(16)

    def call(i: int) -> None:
        seen.append(i)
        (x * 2).sum()

    res = time_calls(call, lambda i: None, device=torch.device("cpu"), use_cupti=False, **kw)  # type: ignore[arg-type]
    return res, seen


def test_exact_call_count_without_extension() -> None:
    res, seen = _run(warmup=3, iterations=7)
    assert res.calls == 10 and seen == list(range(10))
    assert len(res.samples_ms) == 7 and res.method == "cpu-clock"


def test_fast_calls_are_extended_up_to_the_cap() -> None:
    res, seen = _run(warmup=3, iterations=7, min_timed_ms=1000.0, max_iterations=40)
    assert res.calls == 43 and len(res.samples_ms) == 40 and seen == list(range(43))


def test_extension_needs_warmup_and_a_higher_cap() -> None:
    res, _ = _run(warmup=0, iterations=5, min_timed_ms=1000.0, max_iterations=40)
    assert res.calls == 5  # no warm-up median to estimate from
    res, _ = _run(warmup=2, iterations=5, min_timed_ms=1000.0, max_iterations=3)
    assert res.calls == 7  # the cap is below the asked iterations: nothing extended


def test_slow_enough_calls_are_not_extended() -> None:
    res, _ = _run(warmup=2, iterations=5, min_timed_ms=1e-9, max_iterations=100)
    assert res.calls == 7


class FakeCallLog:
    """Stands in for kernelarc.guard.cupti.CallLog, which needs CUDA and CUPTI: counts the
    calls begun and answers ``peek`` with fixed spans."""

    def __init__(self, spans: list[float | None]) -> None:
        self.spans, self.begun, self.peeked_after = spans, 0, -1

    def begin(self) -> None:
        self.begun += 1

    def peek(self) -> list[float | None]:
        self.peeked_after = self.begun
        return self.spans


def test_the_timed_call_count_comes_from_the_logs_spans_not_the_event_times() -> None:
    """Under CUPTI the samples are kernel spans; event times also hold launch gaps. A 2 µs
    kernel whose events read 50 µs must get the calls its spans ask for."""
    extend = _Extend(iterations=100, min_timed_ms=1.0, max_iterations=1000)
    loop = _Loop(lambda i: None, lambda i: None, torch.device("cpu"), lambda: None)
    events = [0.05] * 8
    assert extend.count(loop._warm_estimate(events)) == 100  # 1 ms / 50 µs = 20 < 100
    loop.log = FakeCallLog([0.002] * 7 + [None])
    assert extend.count(loop._warm_estimate(events)) == 500  # 1 ms / 2 µs
    loop.log = FakeCallLog([None] * 8)  # nothing recorded: the event times
    assert loop._warm_estimate(events) == events


def test_the_log_is_read_one_warm_up_call_early() -> None:
    """The peek's flush delays the next call, so one warm-up call follows it."""
    log = FakeCallLog([1.0])
    loop = _Loop(lambda i: None, lambda i: None, torch.device("cpu"), lambda: None, log=log)
    loop.run(5, _Extend(iterations=3, min_timed_ms=0.0, max_iterations=0))
    assert log.peeked_after == 4 and loop.calls == 8 and len(loop.samples) == 3


def test_escape_rule() -> None:
    r = TimingResult("cupti", [1.0])
    _check_escape(r, caller_ms=[0.05, 0.05, 0.05], all_ms=[0.06, 0.07, 0.06], what="x")
    assert not r.escaped
    _check_escape(r, caller_ms=[0.05, 0.05, 0.05], all_ms=[1.2, 1.3, 1.2], what="x")
    assert r.escaped and "escaped" in r.escape_detail


def test_slow_calls_are_shortened_to_the_time_budget() -> None:
    import time

    seen: list[int] = []

    def call(i: int) -> None:
        seen.append(i)
        time.sleep(0.004)

    res = time_calls(
        call,
        lambda i: None,
        warmup=2,
        iterations=50,
        device=torch.device("cpu"),
        use_cupti=False,
        max_timed_ms=8.0,
    )
    assert res.calls == 2 + 10 and len(res.samples_ms) == 10  # MIN_ITERATIONS floor


def test_keep_gets_every_result_after_its_measurement() -> None:
    """``keep`` sees each call's result, in order, after the call was measured (the caller's
    bookkeeping is not timed); ``before`` of the next call comes after it."""
    order: list[tuple[str, int]] = []

    def before(i: int) -> None:
        order.append(("before", i))

    def keep(i: int, ret: object) -> None:
        assert ret == i * 10
        order.append(("keep", i))

    res = time_calls(
        lambda i: i * 10,
        before,
        warmup=2,
        iterations=3,
        device=torch.device("cpu"),
        use_cupti=False,
        keep=keep,
    )
    assert res.calls == 5
    assert order == [(k, i) for i in range(5) for k in ("before", "keep")]


def test_pool_tensors_are_padded_to_a_page_on_cuda_only() -> None:
    cuda, cpu = SimpleNamespace(type="cuda"), torch.device("cpu")
    assert placed_elems(100, 2, cuda) == PLACEMENT_BYTES // 2
    assert placed_elems(100, 4, cpu) == 100
    big = PLACEMENT_BYTES  # elements: larger than a page in any dtype
    assert placed_elems(big, 2, cuda) == big
    # The pool's memory estimate counts the padding a CUDA tensor will get (none here).
    assert tensor_bytes([torch.ones(10), 3, torch.ones(2, dtype=torch.float64)]) == 56


def test_shifted_copy_keeps_values_and_shape_and_moves_the_data() -> None:
    t = torch.arange(12.0).view(3, 4)
    c = shifted_copy(t, 16)
    assert torch.equal(c, t) and c.shape == t.shape
    assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    assert c.storage_offset() == 16 and c.untyped_storage().nbytes() == (12 + 16) * 4


def test_placed_leaves_cpu_tensors_and_scalars_alone() -> None:
    t = torch.ones(4)
    out = placed([t, 2.5, None])
    assert out[0] is t and out[1:] == [2.5, None]


@pytest.mark.gpu
def test_placed_small_cuda_tensors_get_pages_of_their_own() -> None:
    small = [torch.randn(1000, device="cuda") for _ in range(8)]
    large = torch.empty(PLACEMENT_BYTES, dtype=torch.uint8, device="cuda")
    out = placed([*small, large])
    assert out[-1] is large  # not copied
    for a, b in zip(small, out[:-1], strict=True):
        assert torch.equal(a, b)
        assert b.untyped_storage().nbytes() >= PLACEMENT_BYTES
    starts = sorted(b.data_ptr() for b in out[:-1])
    assert all(y - x >= PLACEMENT_BYTES for x, y in zip(starts, starts[1:], strict=False))


def test_tick_median_reads_between_the_ticks_of_a_coarse_clock() -> None:
    tick = 0.032
    lo, mid, hi = 2.240, 2.240 + tick, 2.240 + 2 * tick
    # 30% / 50% / 20%: the median tick holds the 30th-80th percentiles; the 50th lies 40%
    # of the way into it.
    s = sorted([lo] * 300 + [mid] * 500 + [hi] * 200)
    assert tick_median(s) == pytest.approx(mid - tick / 2 + tick * 0.4)
    assert tick_median(sorted([lo] * 250 + [mid] * 500 + [hi] * 250)) == pytest.approx(mid)
    # A small shift of the distribution moves it a little, where the plain median jumps a tick.
    shifted = sorted([lo] * 240 + [mid] * 500 + [hi] * 260)
    assert (
        0
        < tick_median(shifted) - tick_median(sorted([lo] * 250 + [mid] * 500 + [hi] * 250))
        < tick / 10
    )


def test_tick_median_is_the_plain_median_of_unquantised_or_few_samples() -> None:
    import random
    import statistics

    rng = random.Random(0)
    fine = sorted(rng.random() for _ in range(200))
    assert tick_median(fine) == statistics.median(fine)
    assert tick_median([1.0, 2.0, 3.0]) == 2.0
    assert tick_median(sorted([1.0] * 10 + [1.5] * 10 + [1.7] * 10)) == 1.5  # gaps not whole ticks


def test_the_cpu_flush_writes_one_buffer_every_time() -> None:
    f = Flusher(torch.device("cpu"))
    assert f.windows == 1 and f.buf.numel() == f.size == 64 << 20
    assert {f.window(i) for i in range(8)} == {(0, 64 << 20)}
    f()
    f()
    assert int(f.buf[0]) == 2 and int(f.buf[-1]) == 2


@pytest.mark.gpu
def test_the_cuda_flush_rotates_its_windows_and_what_stays_in_l2() -> None:
    f = Flusher(torch.device("cuda"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert f.size == 2 * f.span >= 2 * l2
    assert 1 <= f.windows <= FLUSH_WINDOWS
    assert f.buf.numel() == (f.windows + 1) * f.span
    spans = [f.window(i) for i in range(f.windows)]
    assert all(hi - lo == f.size and hi <= f.buf.numel() for lo, hi in spans)
    tails = {hi - f.span for _, hi in spans}  # the last L2's worth each flush writes
    assert len(tails) == f.windows
    assert f.window(f.windows) == spans[0]
    f()
    torch.cuda.synchronize()
    lo, hi = f.window(1)
    assert int(f.buf[lo]) == 1 and int(f.buf[hi - 1]) == 1
