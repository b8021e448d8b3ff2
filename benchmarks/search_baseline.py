"""torch.compile's baseline as the search itself judged it, for ``agents_h200.py``.

The compiler agent's first proposal is the reference compiled exactly as the guard's
baseline compiles it (``proposers.compiler.BASELINE``: ``torch.compile(run,
dynamic=False)``). Where the search judged that candidate and the chosen one with the full
protocol, their latencies on every workload give a "vs torch.compile" over all the run's
workloads at no extra device time: two candidates of one search, judged alike (one guard,
the same input placement rule, a worker process each). The chosen candidate's own full
stage is used, not its confirmation in a fresh process (``orchestration/confirm.py``),
which the baseline never gets. On a CUDA device the full stage times the reference once per
workload and reuses it (``judge.py``), so for rows written before the latencies were kept
(no ``search_compile``) the ratio of the two full-stage scores, each over all the run's
workloads, is the same geomean (:func:`from_scores`). Not covered: a baseline the search
stopped at its screening (hopeless, failed, or out of time) gives no figure here; then only
the compile baseline's own guard session (``agents_h200.compile_baseline``) measures it.
"""

from __future__ import annotations

from typing import Any

from kernelarc.problem.schema import Definition
from kernelarc.proposers.compiler import BASELINE, compiled_source, variant_named
from kernelarc.store.sqlite import SQLiteStore


def _full_latencies(store: SQLiteStore, cid: str) -> dict[str, float]:
    full = [e for e in store.evaluations(cid) if e.stage == "full"]
    per = full[-1].result.per_workload if full else ()
    return {r.uuid: r.latency_ms for r in per if r.status == "PASSED" and r.latency_ms}


def baseline_in_search(
    store: SQLiteStore, definition: Definition, chosen: str
) -> dict[str, Any] | None:
    """The search's judging of torch.compile's baseline: its candidate, the last stage it
    reached, its full-stage latency by workload uuid where it PASSED, and the same of the
    ``chosen`` candidate (the one the run handed over, or the one its confirmation judged
    again); None when the search never proposed the baseline."""
    want = compiled_source(definition.reference, variant_named(BASELINE))
    for cand in store.candidates():
        if cand.agent != "compiler" or [s.content for s in cand.solution.sources] != [want]:
            continue
        stages = {e.stage for e in store.evaluations(cand.id)}
        return {
            "candidate": cand.id,
            "stage": "full" if "full" in stages else ("screen" if stages else "not judged"),
            "latency_ms": _full_latencies(store, cand.id),
            "chosen": chosen,
            "chosen_latency_ms": _full_latencies(store, chosen),
        }
    return None


def vs_search_baseline(found: dict[str, Any] | None) -> list[float]:
    """Per workload both PASSED the full stage: baseline latency / chosen latency."""
    base = (found or {}).get("latency_ms") or {}
    ours = (found or {}).get("chosen_latency_ms") or {}
    return [base[u] / ours[u] for u in ours if u in base]


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
