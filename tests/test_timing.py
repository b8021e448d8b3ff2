"""The timing loop (kernelarc.guard.timing) on the CPU: call counts, the extension of the
timed calls for fast kernels, and the escape rule. GPU timing methods are covered by
tests/test_cupti.py and the H200 benchmarks, not here."""

from __future__ import annotations

import torch

from kernelarc.guard.timing import TimingResult, _check_escape, time_calls


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
