"""torch.compile's baseline as the run judged it (``kernelarc.report.baseline``) and its line
in the report.

Covered, on a real SQLite store: the compiler's candidate described as the baseline is
found (another configuration of the compiler is not), its full stage and the chosen
candidate's give their latencies by workload (failed workloads left out) and the ratios on
the workloads both passed; a baseline stopped at its screening gives the stage and no
latency; a run without it gives None. The report's line for each case (rendered from a
``RunReport``). The real compiler agent's baseline in a real run: the benchmark's end-to-end
test (``test_optimizer_bench.py``).
"""

from __future__ import annotations

from pathlib import Path

from kernelarc.agents.types import CandidateResult, WorkloadResult
from kernelarc.problem.loader import load_problem
from kernelarc.problem.reference import make_solution
from kernelarc.proposers.compiler import (
    BASELINE,
    COMPILED_ENTRY,
    compiled_source,
    reference_description,
    variant_named,
)
from kernelarc.report.baseline import CompileBaseline, compile_baseline
from kernelarc.report.markdown import render
from kernelarc.report.trajectory import RunReport
from kernelarc.store.base import CandidateRecord, EvaluationRecord
from kernelarc.store.sqlite import SQLiteStore

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"


def _add(store: SQLiteStore, cid: str, variant: str, stages: dict[str, list[float | None]]) -> None:
    definition = load_problem(EXAMPLE).definition
    v = variant_named(variant)
    sol = make_solution(
        definition, agent="compiler", name=f"s-{cid}", description=reference_description(v),
        entry=COMPILED_ENTRY, source=compiled_source(definition.reference, v),
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
            stage=stage, per_workload=per, passed=all(lats), score=1.5 if all(lats) else None,
        )  # fmt: skip
        store.add_evaluation(EvaluationRecord(candidate_id=cid, stage=stage, result=result))  # type: ignore[arg-type]


def test_the_baseline_is_found_by_its_description_and_read_from_its_full_stage(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite")
    _add(store, "c0001-compiler", "default", {"screen": [1.0], "full": [1.0, 1.0, None]})
    assert compile_baseline(store, "c0001-compiler") is None, "another configuration"
    _add(store, "c0002-compiler", BASELINE, {"screen": [2.0], "full": [2.0, None, 4.0]})
    found = compile_baseline(store, "c0001-compiler")
    assert found == CompileBaseline(
        candidate="c0002-compiler",
        stage="full",
        latency_ms={"w0": 2.0, "w2": 4.0},
        chosen="c0001-compiler",
        chosen_latency_ms={"w0": 1.0, "w1": 1.0},
        screen_score=1.5,
    )
    assert found.ratios() == [2.0], "w0 only: w1 and w2 each failed once"


def test_a_baseline_stopped_at_its_screening_gives_no_latency(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite")
    _add(store, "c0001-compiler", BASELINE, {"screen": [9.0]})
    found = compile_baseline(store, "c0001-compiler")
    assert found is not None and found.stage == "screen" and found.ratios() == []
    assert found.screen_score == 1.5 and found.stopped is None


def _report(cb: CompileBaseline | None, origin: str | None = None) -> str:
    wl = WorkloadResult(uuid="w0", axes={"b": 1}, status="PASSED", latency_ms=1.0,
                        reference_ms=3.0)  # fmt: skip
    best = {"path": "best/solution.json", "candidate_id": "c0009"}
    report = RunReport(
        run_dir="r", summary={"problem": "p", "best": best}, config={}, steps=[],
        best_id="c0009", best_origin=origin, best_workloads=[wl, wl], conclusions=[],
        notable=[], compile_baseline=cb,
    )  # fmt: skip
    return render(report)


def test_the_report_gives_the_speedup_over_the_baseline_or_says_why_not() -> None:
    ours = {"w0": 2.0, "w1": 1.0}
    cb = CompileBaseline(candidate="c0002-compiler", stage="full", latency_ms={"w0": 3.0},
                         chosen="c0005-tuner", chosen_latency_ms=ours)  # fmt: skip
    text = _report(cb, origin="c0005-tuner")
    assert "(`torch.compile(run, dynamic=False)`, `c0002-compiler`), judged in full" in text
    assert "speedup 1.50× for `c0005-tuner` as the search judged it" in text
    assert "over the 1/2 workloads both passed" in text
    screened = cb.model_copy(update={"stage": "screen", "latency_ms": {}, "screen_score": 1.2})
    text = _report(screened)
    assert "no further than its screen stage in this run (1.20× the eager reference" in text
    assert "--compile-baseline" in text
    hopeless = screened.model_copy(update={"screen_score": None, "stopped": "hopeless: 2 ms"})
    assert "its screen stage in this run (stopped: hopeless: 2 ms): no comparison" in _report(
        hopeless
    )
    assert "torch.compile" not in _report(None)
