"""A run's trajectory and lessons, read back from its store into plain typed rows.

Covered: every judged candidate in the order the guard judged it (agent, parent, how far it
got, its score, whether it became its agent's incumbent, the run's best score so far), the
handed-over solution's per-workload results, the conclusions, the events a user should
know of (time limit warnings, skipped confirmations, agents that failed to propose), and
torch.compile's baseline as the run judged it (``baseline.py``). Read
only: nothing here writes the store. Not covered: rendering (``markdown.py``, ``plot.py``).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from kernelarc.agents.types import Conclusion, WorkloadResult
from kernelarc.orchestration.finish import run_status
from kernelarc.report.baseline import CompileBaseline, compile_baseline
from kernelarc.store.base import Store

#: Events worth a line in the report (the rest are in ``events.jsonl``).
NOTABLE = (
    "full_protocol_too_slow",
    "confirmation",
    "confirmation_skipped",
    "composition_skipped",
    "fallback",
    "propose_error",
    "no_solution",
    "reference_broken",
    "resumed",
    "interrupted",
)


#: The finishers' events: each judges one candidate in full after the search.
FINISHES = ("composition", "fallback", "confirmation")


class Step(BaseModel):
    """One judged candidate."""

    model_config = ConfigDict(frozen=True)
    order: int
    candidate_id: str
    agent: str
    strategy: str
    parent_id: str | None
    at_s: float
    """Seconds from the run's start to the end of its judgement."""
    stage: str
    """How far it got: ``screen`` or ``full``."""
    passed: bool
    score: float | None
    """Geomean speedup over the eager reference at the stage it reached (None: failed)."""
    stopped: str | None
    improved: bool
    """It became its agent's incumbent (a finisher's: kept, or reproduced)."""
    best_so_far: float | None
    """The search's best full-protocol score up to this step."""
    hypothesis: str


class RunReport(BaseModel):
    model_config = ConfigDict(frozen=True)
    run_dir: str
    summary: dict[str, Any]
    config: dict[str, Any]
    steps: list[Step]
    best_id: str | None
    best_origin: str | None
    """The candidate the handed-over solution was confirmed from (None: not a confirmation)."""
    best_workloads: list[WorkloadResult]
    conclusions: list[Conclusion]
    notable: list[dict[str, Any]]
    """Notable events in order, each with its ``kind``."""
    compile_baseline: CompileBaseline | None = None
    """torch.compile's baseline as the run judged it (``baseline.py``), beside the chosen
    candidate; None without a chosen one or without the baseline."""


def _seconds(at: str, start: datetime) -> float:
    return (datetime.fromisoformat(at) - start).total_seconds()


def read_run(store: Store, run_dir: Path) -> RunReport:
    """Everything the report shows, from ``store`` (the run in ``run_dir``)."""
    summary = run_status(store, run_dir)
    events = store.events()
    config_events = [e for e in events if e.kind == "run_config"]
    config = dict(config_events[-1].payload) if config_events else {}
    start = datetime.fromisoformat(events[0].at) if events else datetime.now()
    cands = {c.id: c for c in store.candidates()}
    steps: list[Step] = []
    best: float | None = None
    for ev in (e for e in events if e.kind == "evaluated" or e.kind in FINISHES):
        cid = str(ev.payload.get("candidate"))
        rec = cands.get(cid)
        stages = ev.payload.get("stages") or {}
        if ev.kind in FINISHES:  # judged in full once, after the search
            stages = {"full": {**ev.payload, "stopped": ev.payload.get("stopped")}}
        if rec is None or not stages:
            continue
        stage = "full" if "full" in stages else "screen"
        reached = stages[stage]
        passed = bool(reached.get("passed"))
        score = reached.get("score") if passed else None
        if ev.kind == "evaluated" and stage == "full" and score is not None:
            best = score if best is None else max(best, score)
        steps.append(
            Step(
                order=len(steps) + 1,
                candidate_id=cid,
                agent=rec.agent,
                strategy=rec.strategy,
                parent_id=rec.parent_id,
                at_s=_seconds(ev.at, start),
                stage=stage,
                passed=passed,
                score=score,
                stopped=reached.get("stopped"),
                improved=any(ev.payload.get(k) for k in ("improved", "kept", "reproduced")),
                best_so_far=best,
                hypothesis=rec.hypothesis,
            )
        )
    best_events = [e for e in events if e.kind == "best"]
    best_id = str(best_events[-1].payload.get("candidate")) if best_events else None
    origin = best_events[-1].payload.get("confirms") if best_events else None
    full = [e for e in store.evaluations(best_id) if e.stage == "full"] if best_id else []
    return RunReport(
        run_dir=str(run_dir),
        summary=summary,
        config=config,
        steps=steps,
        best_id=best_id,
        best_origin=str(origin) if origin else None,
        best_workloads=list(full[-1].result.per_workload) if full else [],
        conclusions=store.conclusions(),
        notable=[{"kind": e.kind, **e.payload} for e in events if e.kind in NOTABLE],
        compile_baseline=compile_baseline(store, str(origin or best_id)) if best_id else None,
    )
