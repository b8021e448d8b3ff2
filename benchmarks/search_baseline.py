"""torch.compile's baseline as the search itself judged it, for ``optimizer_bench.py``.

The run's report finds it (``kernelarc.report.baseline``: the compiler agent's first
proposal, the reference compiled as torch.compile's baseline; the chosen candidate's own
full stage beside it, not its confirmation). This adds, for the benchmark's rows: the
record kept in a row (``search_compile``), its ratios, and for rows written before that
record was kept, the ratio of the two full-stage scores from the row's trajectory. On a
CUDA device the full stage times the reference once per workload and reuses it
(``judge.py``), so over the same workloads, all PASSED, that ratio is the same geomean
(:func:`from_scores`).
"""

from __future__ import annotations

from typing import Any

from kernelarc.proposers.compiler import BASELINE, variant_named
from kernelarc.report.baseline import CompileBaseline, compile_baseline
from kernelarc.store.sqlite import SQLiteStore


def baseline_in_search(store: SQLiteStore, chosen: str) -> dict[str, Any] | None:
    """``kernelarc.report.baseline.compile_baseline`` as a row keeps it (None: the search
    never proposed the baseline)."""
    found = compile_baseline(store, chosen)
    return None if found is None else found.model_dump(mode="json")


def vs_search_baseline(found: dict[str, Any] | None) -> list[float]:
    """Per workload both PASSED the full stage: baseline latency / chosen latency."""
    return [] if not found else CompileBaseline.model_validate(found).ratios()


def from_scores(best: dict[str, Any]) -> tuple[float, int] | None:
    """For a row without ``search_compile``: (the chosen candidate's full-stage score / the
    baseline's, the run's workloads) from the row's trajectory, where both passed the full
    stage (the baseline known by its claim, which names the configuration and no other
    candidate as its base); else None."""
    prefix = f"torch.compile {variant_named(BASELINE).label()}:"
    chosen = best.get("confirms") or best.get("candidate")
    full = {t["candidate"]: t for t in best.get("trajectory") or [] if t["stage"] == "full"}
    base = [t for t in full.values() if (t.get("claim") or "").startswith(prefix)]
    ours = full.get(chosen)
    if not base or ours is None or base[0]["agent"] != "compiler":
        return None
    if not (base[0]["passed"] and base[0]["score"] and ours["passed"] and ours["score"]):
        return None
    return float(ours["score"]) / float(base[0]["score"]), len(best.get("per_workload") or [])
