"""The end of a run: pick the best fully validated candidate, try a shape-gated composition
of the per-workload winners (kept only if the guard finds it significantly better), confirm
the choice in a new process with empty JIT caches (``confirm.py``: a runner-up when its
speed does not reproduce), and, when what is chosen (and confirmed) is slower than the eager
reference, judge the reference itself in full and hand it back instead if it is
significantly faster (``RunConfig.reference_fallback``):
a run never returns a solution the guard measured slower than the code it was given, when
it had the time to check. Then write ``best/`` and the summary. Also ``run_status``: what
``kernelarc status`` reports, computed from the store alone.

The finishers' candidates (``FINISHERS``) cost no budget. Under a time limit the search
keeps time for the composition (``Orchestrator.reserve``), and the composition is skipped,
with an event, when less is left than its parts' longest judgement
(``Orchestrator.judging_cost``); the fallback gets what is left and is skipped, with an
event, when nothing is. An interrupted run (Ctrl-C, SIGTERM) neither composes nor
confirms, with an event for each (the fallback, when needed, still judges the reference).
A stop signal that comes during one of these judgements abandons it (an ``interrupted``
event names which) and the run hands over what it has; one that comes between them or while
the solution is written waits (the Q 001 run of session 33, stopped by ``timeout`` during
its confirmation, used to hand nothing over, with six full passes in its store).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelarc.agents.types import CandidateResult
from kernelarc.guard.verdict import WorkloadOutcome
from kernelarc.orchestration.confirm import CONFIRMER, confirm
from kernelarc.orchestration.failures import common_failure
from kernelarc.orchestration.judge import TIME_LIMIT, results_of, score_of, significant
from kernelarc.problem.schema import Solution
from kernelarc.store.base import CandidateRecord, EvaluationRecord, Store

if TYPE_CHECKING:
    from kernelarc.orchestration.orchestrator import Orchestrator

COMPOSER = "composer"
FALLBACK = "reference-fallback"
COMPOSE_MARGIN = 2.0
"""A composition is judged only when the per-workload winners, routed at no cost, would beat
the best single candidate by more than this many times ``min_gain`` (dispatching does cost:
on FIB 007's 15 us GEMMs a composition of two near-equal parts read 0.62x of the best)."""
INTERRUPTED = "the run was interrupted (Ctrl-C or SIGTERM): the search's best is handed over"
"""Why an interrupted run neither composes nor confirms: it was asked to stop, and each is a
judgement of its own (``--resume`` finishes the run in full). The reference fallback still
runs: a run does not hand over what it measured slower than the code it was given."""
FINISHERS = frozenset({COMPOSER, FALLBACK, CONFIRMER})
"""Agents of the candidates made at the end of a run (not budgeted, not agents of the run)."""


def _full_passes(store: Store) -> list[tuple[CandidateRecord, EvaluationRecord]]:
    """The agents' candidates that passed the full protocol. A resumed run's earlier
    finishers are not among them: each finish composes (and falls back) afresh."""
    out = []
    for rec in store.candidates():
        if rec.agent in FINISHERS:
            continue
        for ev in store.evaluations(rec.id):
            if ev.stage == "full" and ev.result.passed and ev.result.score:
                out.append((rec, ev))
    return out


def finish(orch: Orchestrator) -> dict[str, Any]:
    """The end of the run (module docstring); its summary. A stop signal cuts only the
    judgements (``interrupts.DeferredInterrupt.window``); one that comes after the last of
    them waits for the solution's files and is then recorded."""
    with orch.sigint.held():
        summary = _finish(orch)
        late, orch.sigint.pending = orch.sigint.pending, False
    if late:
        orch.stopped_by_signal("handover")
    return summary


def _finish(orch: Orchestrator) -> dict[str, Any]:
    from kernelarc.problem.reference import reference_solution

    store, cfg = orch.store, orch.config
    reference = reference_solution(
        orch.problem.definition,
        agent=FALLBACK,
        description="The problem's reference, unchanged: no candidate of the run beat it.",
    )
    passes = _full_passes(store)
    if not passes:
        why: dict[str, Any] = {"why": "no candidate passed the full protocol"}
        common = common_failure(store, reference.content_hash())
        if common is not None:
            why["common_failure"] = common.sentence()
        orch.event("no_solution", why)
        return run_status(store, orch.dir.path)
    best_rec, best_ev = max(passes, key=lambda p: (p[1].result.score or 0.0, -p[0].seq))
    chosen = (best_rec, best_ev)
    if cfg.compose and len(passes) >= 2 and orch.interrupted:
        orch.event("compose_skipped", {"why": INTERRUPTED})
    elif cfg.compose and len(passes) >= 2 and orch.time_left_total() <= 0:
        orch.event("compose_skipped", {"why": "time limit reached"})
    elif cfg.compose and len(passes) >= 2:
        composed = _compose(orch, passes, best_rec, best_ev)
        if composed is not None:
            chosen = composed
    confirmable = cfg.confirm and chosen[0].content_hash != reference.content_hash()
    if confirmable and orch.interrupted:
        orch.event("confirmation_skipped", {"candidate": chosen[0].id, "why": INTERRUPTED})
    elif confirmable:
        confirmed = confirm(orch, chosen, passes)
        if confirmed is None:
            orch.event("no_solution", {"why": "every candidate confirmed failed in a new process"})
            return run_status(store, orch.dir.path)
        chosen = confirmed
    if cfg.reference_fallback and (chosen[1].result.score or 0.0) < 1.0:
        if chosen[0].content_hash == reference.content_hash():
            pass  # the chosen solution is the reference itself
        elif orch.time_left_total() <= 0:
            orch.event("fallback_skipped", {"why": "time limit reached"})
        else:
            chosen = (
                orch.unless_stopped("fallback", lambda: _fallback(orch, reference, *chosen))
                or chosen
            )
    return _hand_over(orch, chosen, reference)


def _hand_over(
    orch: Orchestrator, chosen: tuple[CandidateRecord, EvaluationRecord], reference: Solution
) -> dict[str, Any]:
    """Write ``best/`` and the summary; the summary."""
    itself = chosen[0].content_hash == reference.content_hash()  # its "speedup" is noise
    rec, ev = chosen
    path = orch.dir.write_best(rec.solution, ev.traces)
    best = {"candidate": rec.id, "score": ev.result.score, "path": str(path), "reference": itself}
    if rec.agent == CONFIRMER:
        best["confirms"] = rec.parent_id
    orch.event("best", best)
    cfg = orch.config
    if cfg.memory and cfg.memory_file:
        orch.memory.save(Path(cfg.memory_file))
    summary = run_status(orch.store, orch.dir.path)
    orch.dir.write_summary(summary)
    return summary


def _compose(
    orch: Orchestrator,
    passes: list[tuple[CandidateRecord, EvaluationRecord]],
    best_rec: CandidateRecord,
    best_ev: EvaluationRecord,
) -> tuple[CandidateRecord, EvaluationRecord] | None:
    """The shape-gated composition of the per-workload winners, judged in full; None when
    it is not worth judging, not significantly better, or its judgement was cut by a stop
    signal (one that came while it was planned waits for the next judgement)."""
    from kernelarc.orchestration.compose import CompositionError, compose, predicted_gain

    problem = orch.problem
    gain = predicted_gain(problem.definition, problem.workloads, full_latencies(passes))
    if gain <= 1.0 + COMPOSE_MARGIN * orch.config.min_gain:
        orch.event(
            "composition_skipped",
            {"why": f"predicted gain {gain:.3f}x over the best single candidate is too small"},
        )
        return None
    try:
        winners = _winners(orch, passes)
        if len({rec.id for rec in winners.values()}) < 2:
            return None
        solution = compose(
            orch.problem.definition,
            orch.problem.workloads,
            {u: rec.solution for u, rec in winners.items()},
            default=best_rec.solution,
        )
    except CompositionError as e:
        orch.event("composition_skipped", {"why": str(e)})
        return None
    need, left = orch.judging_cost({rec.id for rec in winners.values()}), orch.time_left_total()
    if orch.config.time_limit_s is not None and need > left:
        # It would be cut by the limit after overrunning it by one workload (L1 017, H200,
        # session 11: started with 21 s left, cut after 64 s), and nothing would be kept.
        orch.event(
            "composition_skipped",
            {"why": f"{max(left, 0.0):.0f} s left, under the {need:.0f} s its parts took to judge"},
        )
        return None
    # only the judgement is cut: a signal during the planning above waits for it
    judged = orch.unless_stopped(
        "composition",
        lambda: judge_final(
            orch,
            solution,
            agent=COMPOSER,
            strategy="composition",
            parent=best_rec.id,
            hypothesis="shape-gated composition of the per-workload winners",
        ),
    )
    if judged is None:
        return None
    record, ev = judged
    per, result = ev.result.per_workload, ev.result
    better = result.passed and significant(per, best_ev.result.per_workload, orch.config.min_gain)
    orch.event(
        "composition",
        {
            "candidate": record.id,
            "passed": result.passed,
            "score": result.score,
            "stopped": result.stopped_early,
            "kept": better,
            "parts": sorted({rec.id for rec in winners.values()}),
        },
    )
    return (record, ev) if better else None


def _winners(
    orch: Orchestrator, passes: list[tuple[CandidateRecord, EvaluationRecord]]
) -> dict[str, CandidateRecord]:
    """Per workload, the candidate a dispatcher routes it to (``compose.routes``)."""
    from kernelarc.orchestration.compose import routes

    by_id = {rec.id: rec for rec, _ in passes}
    chosen = routes(orch.problem.definition, orch.problem.workloads, full_latencies(passes))
    return {u: by_id[cid] for u, cid in chosen.items()}


def full_latencies(
    passes: list[tuple[CandidateRecord, EvaluationRecord]],
) -> dict[str, dict[str, float]]:
    """Candidate id → workload uuid → full-protocol latency (ms), in store order."""
    return {
        rec.id: {r.uuid: r.latency_ms for r in ev.result.per_workload if r.latency_ms}
        for rec, ev in passes
    }


def _fallback(
    orch: Orchestrator, reference: Solution, rec: CandidateRecord, ev: EvaluationRecord
) -> tuple[CandidateRecord, EvaluationRecord]:
    """The reference judged in full; returned instead of ``rec`` when significantly faster."""
    ref_rec, ref_ev = judge_final(
        orch,
        reference,
        agent=FALLBACK,
        strategy="reference",
        parent=rec.id,
        hypothesis=f"the reference itself beats {rec.id} ({ev.result.score:.3g}x over eager)",
    )
    kept = ref_ev.result.passed and significant(
        ref_ev.result.per_workload, ev.result.per_workload, orch.config.min_gain
    )
    orch.event(
        "fallback",
        {
            "candidate": ref_rec.id,
            "passed": ref_ev.result.passed,
            "score": ref_ev.result.score,
            "stopped": ref_ev.result.stopped_early,
            "instead_of": rec.id,
            "kept": kept,
        },
    )
    return (ref_rec, ref_ev) if kept else (rec, ev)


def judge_final(
    orch: Orchestrator,
    solution: Solution,
    *,
    agent: str,
    strategy: str,
    parent: str,
    hypothesis: str,
    fresh_jit: bool = False,
) -> tuple[CandidateRecord, EvaluationRecord]:
    """Judge a finisher's candidate with the full protocol on every workload and record it
    (``fresh_jit``: in a worker with empty JIT caches, ``Guard.evaluate``).
    It stops at its first failing workload (it cannot be kept), and, under a time limit,
    after the workload in progress when the limit is reached (as the search's judgements
    do: a run overshoots its limit by at most one workload's judgement)."""
    full = orch.config.full
    timed = orch.config.time_limit_s is not None

    def stop(o: WorkloadOutcome) -> str | None:
        if o.status.value != "PASSED":
            return f"{o.status.value} on workload {o.workload.uuid}"
        return TIME_LIMIT if timed and orch.time_left_total() <= 0 else None

    res = orch.guard.evaluate(
        solution,
        rounds=full.rounds,
        warmup=full.warmup,
        iterations=full.iterations,
        stop=stop,
        fresh_jit=fresh_jit,
    )
    per = results_of(res.outcomes, orch.bounds)
    passed = res.stopped_early is None and bool(per) and all(r.status == "PASSED" for r in per)
    record = orch.store.add_candidate(
        CandidateRecord(
            id=f"c{len(orch.store.candidates()) + 1:04d}-{agent}",
            content_hash=solution.content_hash(),
            agent=agent,
            strategy=strategy,
            mode="draft",
            parent_id=parent,
            hypothesis=hypothesis,
            solution=solution,
        )
    )
    orch.dir.write_candidate(record)
    result = CandidateResult(
        candidate_id=record.id,
        agent=agent,
        strategy=strategy,
        mode="draft",
        stage="full",
        per_workload=per,
        passed=passed,
        score=score_of(per) if passed else None,
        stopped_early=res.stopped_early,
    )
    ev = orch.store.add_evaluation(
        EvaluationRecord(candidate_id=record.id, stage="full", traces=res.traces, result=result)
    )
    orch.dir.append_traces(res.traces)
    return record, ev


def run_status(store: Store, run_dir: Path) -> dict[str, Any]:
    """The run's state for scripts (names are a contract: see ``kernelarc status``)."""
    config = _config(store)
    cands = store.candidates()
    evals = store.evaluations()
    conclusions = store.conclusions()
    incumbents = store.incumbents()
    composed = {c.id for c in cands if c.agent == COMPOSER}
    finishers = {c.id for c in cands if c.agent in FINISHERS}
    judged = {e.candidate_id for e in evals} - finishers
    passed = {e.candidate_id for e in evals if e.stage == "full" and e.result.passed} - finishers
    agents = []
    for name in config.get("agents", []):
        inc = incumbents.get(name)
        agents.append(
            {
                "name": name,
                "strategy": next((c.strategy for c in cands if c.agent == name), None),
                "candidates": sum(1 for c in cands if c.agent == name),
                "conclusions": sum(1 for c in conclusions if c.agent == name),
                "incumbent": None
                if inc is None
                else {"candidate_id": inc.candidate_id, "score": inc.score},
            }
        )
    best_path = run_dir / "best" / "solution.json"
    best: dict[str, Any] | None = None
    events = store.events("best")
    if best_path.exists() and events:
        last = events[-1].payload
        ev = [e for e in store.evaluations(str(last.get("candidate"))) if e.stage == "full"]
        best = {
            "path": str(best_path),
            "candidate_id": last.get("candidate"),
            "all_passed": bool(ev and ev[-1].result.passed),
            "speedup": ev[-1].result.score if ev else None,
            "is_reference": last.get("reference"),  # None: a run from before it was kept
        }
    return {
        "problem": config.get("definition"),
        "budget": config.get("budget"),
        "evaluated": len(judged),
        "passed": len(passed),
        "agents": agents,
        "conclusions": len(conclusions),
        "candidate_ids": [c.id for c in cands],
        "composed": sorted(composed),
        "fallback": sorted(c.id for c in cands if c.agent == FALLBACK),
        "confirmations": sorted(c.id for c in cands if c.agent == CONFIRMER),
        "workloads": config.get("workloads"),
        "best": best,
        "stopped": (
            store.events("search_stopped")[-1].payload.get("reason")
            if store.events("search_stopped")
            else None
        ),
    }


def _config(store: Store) -> dict[str, Any]:
    events = store.events("run_config")
    if events:
        return dict(events[-1].payload)
    return {}
