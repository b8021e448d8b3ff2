"""Resuming a run from its store: the stored configuration checked against this one, the
agents' and the plateau's saved state, the board (with the incumbents agents had replaced,
replayed from the run's ``incumbent`` events) and the shared memory rebuilt, the budget
already spent counted; candidates judged but not yet told to their agent are told, and
candidates that were in flight when the run died are judged again (nothing else is lost).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kernelarc.agents.types import CandidateResult, IncumbentView
from kernelarc.store.base import CandidateRecord, StoreError

if TYPE_CHECKING:
    from kernelarc.orchestration.orchestrator import Orchestrator

ORCHESTRATOR = "__orchestrator__"
"""The store key of the orchestrator's own state (plateau counters)."""


def incumbent_view(record: CandidateRecord, final: CandidateResult) -> IncumbentView:
    """The board entry of ``record`` judged ``final`` (its last stage)."""
    return IncumbentView(
        agent=record.agent,
        strategy=record.strategy,
        candidate_id=record.id,
        score=final.score or 0.0,
        latencies_ms={r.uuid: r.latency_ms or 0.0 for r in final.per_workload},
        solution=record.solution,
    )


def _rebuild_board(orch: Orchestrator, candidates: list[CandidateRecord]) -> None:
    """Every agent's replaced incumbents in the order they were promoted, then the current
    ones as stored: the board's ``former`` entries survive a resume."""
    current = orch.store.incumbents()
    records = {r.id: r for r in candidates}
    for ev in orch.store.events("incumbent"):
        agent, cid = ev.payload.get("agent"), ev.payload.get("candidate")
        record = records.get(str(cid))
        if record is None or agent not in orch.agents or agent not in current:
            continue
        evals = orch.store.evaluations(record.id)
        if current[agent].candidate_id != record.id and evals:
            orch.board.update(incumbent_view(record, evals[-1].result), owner=record.agent)
    for view in current.values():
        if view.agent in orch.agents:
            orch.board.update(view, owner=view.agent)


def restore(orch: Orchestrator) -> None:
    stored = orch.store.open_run(orch.config.model_dump(mode="json"))
    if stored.get("definition") != orch.config.definition:
        raise StoreError(
            f"{orch.dir.path} holds a run of {stored.get('definition')!r}, "
            f"not {orch.config.definition!r}: use another --run-dir"
        )
    orch.dir.write_config(stored)
    orch.event("run_config", stored)
    if orch.config.memory and orch.config.memory_file:
        path = Path(orch.config.memory_file)
        if path.exists():
            n = orch.memory.load(path)
            orch.event("memory_loaded", {"file": str(path), "conclusions": n})
    states = orch.store.agent_states()
    for name, agent in orch.agents.items():
        if name in states:
            agent.restore(dict(states[name].get("agent") or {}))
    if states.get(ORCHESTRATOR, {}).get("plateau"):
        orch.plateau.restore(dict(states[ORCHESTRATOR]["plateau"]))
    candidates = list(orch.store.candidates())
    _rebuild_board(orch, candidates)
    concluded = set()
    for c in orch.store.conclusions():
        concluded.add(c.candidate_id)
        orch._remember(c)
    pending, untold = [], []
    for rec in candidates:
        if rec.agent not in orch.agents:  # the composer's candidates cost no budget
            continue
        evals = orch.store.evaluations(rec.id)
        if not evals:
            pending.append(rec)
            continue
        orch.used += 1
        orch.per_agent[rec.agent] = orch.per_agent.get(rec.agent, 0) + 1
        inc = orch.board.incumbent(rec.agent)
        if inc is not None and inc.candidate_id == rec.id:
            orch.results[rec.agent] = {e.stage: e.result.per_workload for e in evals}
        if rec.id not in concluded:
            untold.append((rec, evals[-1].result, inc is not None and inc.candidate_id == rec.id))
    if orch.used or pending:
        orch.event(
            "resumed",
            {
                "used": orch.used,
                "redo": [r.id for r in pending],
                "told": [r.id for r, _, _ in untold],
            },
        )
    for rec, result, improved in untold:  # judged, but the run died before the agent knew
        orch.plateau.record(rec.agent, improved)
        orch._observe(
            rec.agent, result.model_copy(update={"improved": improved}), store_conclusion=True
        )
    for rec in pending:  # in flight when the run died: judged again, nothing else lost
        if orch._budget_left() > 0:
            orch._judge(rec)
