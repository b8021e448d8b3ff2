"""Which screened candidates earn the full protocol (``orchestration.judge``): the score
rule, and shape winners (slower overall, but much faster than every incumbent on one
screened workload: the final shape-gated composition can use them only with full results).
Pure functions on typed results; the staging itself runs in test_orchestrator.py."""

from __future__ import annotations

from kernelarc.agents.types import WorkloadResult
from kernelarc.orchestration.judge import SHAPE_WIN, shape_winner


def _res(**lat: float | None) -> list[WorkloadResult]:
    return [
        WorkloadResult(uuid=u, axes={}, status="PASSED" if ms else "RUNTIME_ERROR", latency_ms=ms)
        for u, ms in lat.items()
    ]


def test_much_faster_on_one_workload_is_a_shape_winner() -> None:
    incumbents = [_res(a=1.0, b=10.0), _res(a=0.8, b=12.0)]
    assert shape_winner(_res(a=0.5, b=40.0), incumbents), "0.5 ms beats the best 0.8 ms there"


def test_within_the_margin_or_slower_everywhere_is_not() -> None:
    incumbents = [_res(a=1.0, b=10.0)]
    just_under = 1.0 / SHAPE_WIN * 1.01
    assert not shape_winner(_res(a=just_under, b=20.0), incumbents)
    assert not shape_winner(_res(a=2.0, b=20.0), incumbents)


def test_only_workloads_every_incumbent_was_measured_on_count() -> None:
    incumbents = [_res(a=1.0, b=10.0), _res(a=1.0, b=None)]
    assert not shape_winner(_res(a=2.0, b=1.0), incumbents), "b lacks one incumbent's latency"
    assert not shape_winner(_res(a=None, b=1.0), [_res(a=1.0)]), "no common measured workload"
    assert not shape_winner(_res(a=0.1), []), "no incumbents: the score rule decides"
