"""``benchmarks/search_baseline.py``: torch.compile's baseline as the search judged it.

Covered: for rows written before the latencies were kept, the ratio of the two full-stage
scores from a row's trajectory (the chosen candidate's, not its confirmation's), and none
where either did not pass in full or the baseline is missing; a kept record's ratios. The
record itself: ``test_report_baseline.py``; the benchmark's end-to-end run:
``test_optimizer_bench.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _module() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import search_baseline
    finally:
        sys.path.remove(str(BENCH))
    return search_baseline


def _row(full: list[tuple[str, str, str, float | None]], **best: Any) -> dict[str, Any]:
    traj = [{"candidate": c, "agent": a, "stage": "full", "passed": x is not None,
             "score": x, "claim": claim} for c, a, claim, x in full]  # fmt: skip
    return {"per_workload": [{"uuid": "w0"}, {"uuid": "w1"}], "trajectory": traj, **best}


def test_older_rows_compare_the_two_full_stage_scores() -> None:
    sb = _module()
    base = ("c0004-compiler", "compiler", "torch.compile dynamic=False fullgraph=False: 2x", 2.0)
    other = (
        "c0006-compiler",
        "compiler",
        "torch.compile default settings of c0001-rewrite: x",
        9.0,
    )
    chosen = ("c0012-compiler", "compiler", "torch.compile epilogue_fusion=True: 3x", 3.0)
    confirmation = ("c0013-confirmation", "confirmation", "c0012-compiler (...)", 1.0)
    rows = [base, other, chosen, confirmation]
    confirmed = _row(rows, candidate="c0013-confirmation", confirms="c0012-compiler")
    assert sb.from_scores(confirmed) == (1.5, 2), "the chosen one's score, not its confirmation's"
    assert sb.from_scores(_row(rows, candidate="c0004-compiler")) == (1.0, 2)
    failed = (*base[:3], None)
    assert sb.from_scores(_row([failed, chosen], candidate="c0012-compiler")) is None
    assert sb.from_scores(_row([other, chosen], candidate="c0012-compiler")) is None


def test_a_kept_record_gives_its_ratios() -> None:
    sb = _module()
    kept = {"candidate": "c1", "stage": "full", "latency_ms": {"w0": 3.0, "w1": 2.0},
            "chosen": "c2", "chosen_latency_ms": {"w0": 1.5, "w1": 2.0}}  # fmt: skip
    assert sb.vs_search_baseline(kept) == [2.0, 1.0]
    assert sb.vs_search_baseline(None) == []
