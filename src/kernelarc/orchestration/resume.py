"""Resuming a run from its store: the stored configuration checked against this one, the
agents' and the plateau's saved state, the board (with the incumbents agents had replaced,
replayed from the run's ``incumbent`` events) and the shared memory rebuilt, the budget
already spent counted. :func:`restore` returns what the orchestrator still has to do:
candidates judged but not yet told to their agent are told, and candidates that were in
flight when the run died are judged again (nothing else is lost).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kernelarc.agents.base import Agent
from kernelarc.agents.types import CandidateResult, IncumbentView
from kernelarc.orchestration.config import RunConfig
from kernelarc.orchestration.events import Events
from kernelarc.orchestration.state import RunState
from kernelarc.store.base import CandidateRecord, StoreError

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


@dataclass
class Unfinished:
    """What a resumed run must do before it searches on."""

    untold: list[tuple[CandidateRecord, CandidateResult]] = field(default_factory=list)
    """Judged before the run died, their agent not told: each with its verdict (``improved``
    set: whether it is its agent's incumbent)."""
    pending: list[CandidateRecord] = field(default_factory=list)
    """In flight when the run died: to judge again."""


def _rebuild_board(
    events: Events, state: RunState, agents: Mapping[str, Agent], candidates: list[CandidateRecord]
) -> None:
    """Every agent's replaced incumbents in the order they were promoted, then the current
    ones as stored: the board's ``former`` entries survive a resume."""
    store = events.store
    current = store.incumbents()
    records = {r.id: r for r in candidates}
    for ev in store.events("incumbent"):
        agent, cid = ev.payload.get("agent"), ev.payload.get("candidate")
        record = records.get(str(cid))
        if record is None or agent not in agents or agent not in current:
            continue
        evals = store.evaluations(record.id)
        if current[agent].candidate_id != record.id and evals:
            state.board.update(incumbent_view(record, evals[-1].result), owner=record.agent)
    for view in current.values():
        if view.agent in agents:
            state.board.update(view, owner=view.agent)


def restore(
    config: RunConfig, state: RunState, events: Events, agents: Mapping[str, Agent]
) -> Unfinished:
    """Open the run in the store (a new run, or the one to resume) and rebuild ``state`` and
    the agents from it; what is left to tell and to judge."""
    store = events.store
    stored = store.open_run(config.model_dump(mode="json"))
    if stored.get("definition") != config.definition:
        raise StoreError(
            f"{events.dir.path} holds a run of {stored.get('definition')!r}, "
            f"not {config.definition!r}: use another --run-dir"
        )
    events.dir.write_config(stored)
    events.log("run_config", stored)
    if config.memory and config.memory_file:
        path = Path(config.memory_file)
        if path.exists():
            n = state.memory.load(path)
            events.log("memory_loaded", {"file": str(path), "conclusions": n})
    states = store.agent_states()
    for name, agent in agents.items():
        if name in states:
            agent.restore(dict(states[name].get("agent") or {}))
    if states.get(ORCHESTRATOR, {}).get("plateau"):
        state.plateau.restore(dict(states[ORCHESTRATOR]["plateau"]))
    candidates = list(store.candidates())
    _rebuild_board(events, state, agents, candidates)
    concluded = set()
    for c in store.conclusions():
        concluded.add(c.candidate_id)
        events.remember(c)
    todo = Unfinished()
    for rec in candidates:
        if rec.agent not in agents:  # the finishers' candidates cost no budget
            continue
        evals = store.evaluations(rec.id)
        if not evals:
            todo.pending.append(rec)
            continue
        state.count_judged(rec.agent)
        inc = state.board.incumbent(rec.agent)
        improved = inc is not None and inc.candidate_id == rec.id
        if improved:
            state.results[rec.agent] = {e.stage: e.result.per_workload for e in evals}
        if rec.id not in concluded:
            verdict = evals[-1].result.model_copy(update={"improved": improved})
            todo.untold.append((rec, verdict))
    if state.used or todo.pending:
        events.log(
            "resumed",
            {
                "used": state.used,
                "redo": [r.id for r in todo.pending],
                "told": [r.id for r, _ in todo.untold],
            },
        )
    return todo
