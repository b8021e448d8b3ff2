"""``benchmarks/search_baseline.py``: torch.compile's baseline as the search judged it.

Covered, on a real SQLite store of a run: the compiler's candidate whose source is exactly
the baseline's is found (another configuration of the compiler is not), its full stage
and the chosen candidate's give their latencies by workload (failed workloads left out)
and the ratios on the workloads both passed; a baseline stopped at its screening gives the
stage and no latency, a search without it gives None. For older rows, the ratio of the two
full-stage scores from a row's trajectory (the chosen candidate's, not its confirmation's).
The benchmark's end-to-end run: ``test_agents_bench_merge.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kernelarc.agents.types import CandidateResult, WorkloadResult
from kernelarc.problem.loader import load_problem
from kernelarc.problem.reference import make_solution
from kernelarc.proposers.compiler import (
    BASELINE,
    COMPILED_ENTRY,
    compiled_source,
    variant_named,
)
from kernelarc.store.base import CandidateRecord, EvaluationRecord
from kernelarc.store.sqlite import SQLiteStore

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"


def _module() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import search_baseline
    finally:
        sys.path.remove(str(BENCH))
    return search_baseline


def _add(store: SQLiteStore, cid: str, variant: str, stages: dict[str, list[float | None]]) -> None:
    definition = load_problem(EXAMPLE).definition
    sol = make_solution(
        definition, agent="compiler", name=f"s-{cid}", description="d", entry=COMPILED_ENTRY,
        source=compiled_source(definition.reference, variant_named(variant)),
    )  # fmt: skip
    store.add_candidate(
        CandidateRecord(id=cid, content_hash=sol.content_hash(), agent="compiler",
                        strategy="compiler", mode="draft", solution=sol)
    )  # fmt: skip
    for stage, lats in stages.items():
        per = tuple(
            WorkloadResult(uuid=f"w{i}", axes={}, status="PASSED" if x else "RUNTIME_ERROR",
                           latency_ms=x)
            for i, x in enumerate(lats)
        )  # fmt: skip
        result = CandidateResult(
            candidate_id=cid, agent="compiler", strategy="compiler", mode="draft",
            stage=stage, per_workload=per, passed=all(lats), score=None,
        )  # fmt: skip
        store.add_evaluation(EvaluationRecord(candidate_id=cid, stage=stage, result=result))  # type: ignore[arg-type]


def test_the_baseline_is_found_by_its_exact_source_and_read_from_its_full_stage(
    tmp_path: Path,
) -> None:
    sb = _module()
    definition = load_problem(EXAMPLE).definition
    store = SQLiteStore(tmp_path / "store.sqlite")
    _add(store, "c0001-compiler", "default", {"screen": [1.0], "full": [1.0, 1.0, None]})
    assert sb.baseline_in_search(store, definition, "c0001-compiler") is None, "another one"
    _add(store, "c0002-compiler", BASELINE, {"screen": [2.0], "full": [2.0, None, 4.0]})
    found = sb.baseline_in_search(store, definition, "c0001-compiler")
    assert found == {
        "candidate": "c0002-compiler",
        "stage": "full",
        "latency_ms": {"w0": 2.0, "w2": 4.0},
        "chosen": "c0001-compiler",
        "chosen_latency_ms": {"w0": 1.0, "w1": 1.0},
    }
    assert sb.vs_search_baseline(found) == [2.0], "w0 only: w1 and w2 each failed once"
    assert sb.vs_search_baseline(None) == []


def test_a_baseline_stopped_at_its_screening_gives_no_latency(tmp_path: Path) -> None:
    sb = _module()
    store = SQLiteStore(tmp_path / "store.sqlite")
    _add(store, "c0001-compiler", BASELINE, {"screen": [9.0]})
    found = sb.baseline_in_search(store, load_problem(EXAMPLE).definition, "c0001-compiler")
    assert found is not None and found["stage"] == "screen" and found["latency_ms"] == {}
    assert sb.vs_search_baseline(found) == []


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
