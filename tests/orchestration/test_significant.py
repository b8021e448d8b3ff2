"""``judge.significant``: when a candidate counts as better than an incumbent."""

from __future__ import annotations

import pytest

from kernelarc.agents.types import WorkloadResult
from kernelarc.orchestration.judge import score_of, significant


def _r(uuid: str, lat: float | None, ref: float | None, status: str = "PASSED") -> WorkloadResult:
    return WorkloadResult(uuid=uuid, axes={}, status=status, latency_ms=lat, reference_ms=ref)


def test_same_reference_timing_compares_latencies() -> None:
    # a GPU: both candidates carry the one cached reference timing
    old = [_r("a", 1.0, 2.0), _r("b", 4.0, 8.0)]
    assert significant([_r("a", 0.9, 2.0), _r("b", 3.6, 8.0)], old, 0.02)
    assert not significant([_r("a", 0.99, 2.0), _r("b", 3.96, 8.0)], old, 0.02)


def test_drifting_reference_follows_the_speedups_not_the_latencies() -> None:
    # the CPU: the reference is timed again with each candidate and the machine got faster
    # between the two; the new candidate's latencies are lower, its speedups too
    old = [_r("a", 1.0, 1.0)]
    new = [_r("a", 0.9, 0.8)]
    # by latency alone it would count as 11% faster (1.0 / 0.9), over the 2% bar
    assert not significant(new, old, 0.02)
    assert (score_of(new) or 0) < (score_of(old) or 0)
    # and the other way: slower latencies, but more so the reference's
    assert significant([_r("a", 1.1, 1.5)], old, 0.02)


def test_a_side_without_a_reference_timing_compares_latencies() -> None:
    old = [_r("a", 1.0, None)]
    assert significant([_r("a", 0.5, 1.0)], old, 0.02)
    assert not significant([_r("a", 1.5, 1.0)], old, 0.02)


def test_a_failing_or_unmatched_candidate_is_not_better() -> None:
    old = [_r("a", 1.0, 1.0)]
    assert not significant([_r("a", 0.1, 1.0, status="INCORRECT_NUMERICAL")], old, 0.02)
    assert not significant([_r("b", 0.1, 1.0)], old, 0.02)  # no workload in common
    assert significant([_r("a", 0.1, 1.0)], None, 0.02)  # no incumbent yet


def test_a_gain_needs_both_sides_timed() -> None:
    from kernelarc.orchestration.judge import _gain

    with pytest.raises(ValueError, match="both sides timed"):
        _gain(_r("a", None, None), _r("a", 1.0, None))
    assert _gain(_r("a", 0.5, None), _r("a", 1.0, None)) == 2.0
