"""The end of a run: pick the best fully validated candidate, try a shape-gated composition
of the per-workload winners (kept only if the guard finds it significantly better), confirm
the choice in a new process with empty JIT caches (``confirm.py``: a runner-up when its
speed does not reproduce), and, unless what is chosen (and confirmed) is significantly
faster than the eager reference (``judge.beats_reference``: its geometric-mean speedup over
the reference timed beside it above ``1 + min_gain``), judge the reference itself in full
and hand it back instead (``RunConfig.reference_fallback``): a run hands over a candidate
only when it measured a sure gain over the code it was given, when it had the time to
check. The figure handed over is always the hand-over's own judgement (the confirmation's
when there was one). Then write ``best/`` and the summary. Also ``run_status``: what
``kernelarc status`` reports, computed from the store alone.

The finishers' candidates (``FINISHERS``) cost no budget. Under a time limit the search
keeps time for the composition (``schedule.reserve``), and the composition is skipped,
with an event, when less is left than its parts' longest judgement
(``RunState.judging_cost``); the fallback gets what is left and is skipped, with an
event, when nothing is. An interrupted run (Ctrl-C, SIGTERM) neither composes nor
confirms, with an event for each (the fallback, when needed, still judges the reference).
A stop signal that comes during one of these judgements abandons it (an ``interrupted``
event names which) and the run hands over what it has; one that comes between them or while
the solution is written waits, so a run stopped at its end still hands over its best.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernelarc.orchestration.clock import Clock
from kernelarc.orchestration.compose import (
    COMPOSE_MARGIN,
    CompositionError,
    compose,
    predicted_gain,
    routes,
)
from kernelarc.orchestration.config import RunConfig
from kernelarc.orchestration.confirm import CONFIRMER, confirm
from kernelarc.orchestration.events import Events
from kernelarc.orchestration.failures import common_failure
from kernelarc.orchestration.final import FinalJudge, Pass
from kernelarc.orchestration.judge import beats_reference, significant
from kernelarc.orchestration.state import RunState
from kernelarc.problem.loader import Problem
from kernelarc.problem.reference import reference_solution
from kernelarc.problem.schema import Definition, Solution, Workload
from kernelarc.store.base import CandidateRecord, Store

COMPOSER = "composer"
FALLBACK = "reference-fallback"
INTERRUPTED = "the run was interrupted (Ctrl-C or SIGTERM): the search's best is handed over"
"""Why an interrupted run neither composes nor confirms: it was asked to stop, and each is a
judgement of its own (``--resume`` finishes the run in full). The reference fallback still
runs: a run does not hand over what it measured slower than the code it was given."""
FINISHERS = frozenset({COMPOSER, FALLBACK, CONFIRMER})
"""Agents of the candidates made at the end of a run (not budgeted, not agents of the run)."""


def _full_passes(store: Store) -> list[Pass]:
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


class Finisher:
    """The end of a run (module docstring), once the search has stopped."""

    def __init__(
        self,
        problem: Problem,
        config: RunConfig,
        state: RunState,
        clock: Clock,
        events: Events,
        final: FinalJudge,
    ) -> None:
        self.problem, self.config, self.state, self.clock = problem, config, state, clock
        self.events, self.final = events, final
        self.store, self.dir = events.store, events.dir

    def finish(self) -> dict[str, Any]:
        """The run's summary. A stop signal cuts only the judgements
        (``interrupts.DeferredInterrupt.window``); one that comes after the last of them
        waits for the solution's files and is then recorded."""
        sigint = self.events.sigint
        with sigint.held():
            summary = self._finish()
            late, sigint.pending = sigint.pending, False
        if late:
            self.events.stopped_by_signal("handover")
        return summary

    def _finish(self) -> dict[str, Any]:
        store, cfg, events, state = self.store, self.config, self.events, self.state
        reference = reference_solution(
            self.problem.definition,
            agent=FALLBACK,
            description="The problem's reference, unchanged: no candidate of the run beat it.",
        )
        passes = _full_passes(store)
        if not passes:
            why: dict[str, Any] = {"why": "no candidate passed the full protocol"}
            if state.reference_broken is not None:
                why["why"] = f"the reference is broken: {state.reference_broken}"
            elif (common := common_failure(store, reference.content_hash())) is not None:
                why["common_failure"] = common.sentence()
            events.log("no_solution", why)
            return self._end(handed_over=False)
        best_rec, best_ev = max(passes, key=lambda p: (p[1].result.score or 0.0, -p[0].seq))
        chosen = (best_rec, best_ev)
        if cfg.compose and len(passes) >= 2 and state.interrupted:
            events.log("compose_skipped", {"why": INTERRUPTED})
        elif cfg.compose and len(passes) >= 2 and self.clock.left_total() <= 0:
            events.log("compose_skipped", {"why": "time limit reached"})
        elif cfg.compose and len(passes) >= 2:
            composed = self._compose(passes, chosen)
            if composed is not None:
                chosen = composed
        confirmable = cfg.confirm and chosen[0].content_hash != reference.content_hash()
        if confirmable and state.interrupted:
            events.log("confirmation_skipped", {"candidate": chosen[0].id, "why": INTERRUPTED})
        elif confirmable:
            confirmed = confirm(
                chosen,
                passes,
                final=self.final,
                state=state,
                clock=self.clock,
                events=events,
            )
            if confirmed is None:
                why_none = "every candidate confirmed failed in a new process"
                events.log("no_solution", {"why": why_none})
                return self._end(handed_over=False)
            chosen = confirmed
        if cfg.reference_fallback and not beats_reference(
            chosen[1].result.per_workload, cfg.min_gain
        ):
            if chosen[0].content_hash == reference.content_hash():
                pass  # the chosen solution is the reference itself
            elif self.clock.left_total() <= 0:
                events.log("fallback_skipped", {"why": "time limit reached"})
            else:
                current = chosen
                chosen = (
                    events.unless_stopped("fallback", lambda: self._fallback(reference, current))
                    or chosen
                )
        return self._hand_over(chosen, reference)

    def _hand_over(self, chosen: Pass, reference: Solution) -> dict[str, Any]:
        """Write ``best/`` and the summary; the summary."""
        itself = chosen[0].content_hash == reference.content_hash()  # its "speedup" is noise
        rec, ev = chosen
        path = self.dir.write_best(rec.solution, ev.traces)
        best = {
            "candidate": rec.id,
            "score": ev.result.score,
            "path": str(path),
            "reference": itself,
        }
        if rec.agent == CONFIRMER:
            best["confirms"] = rec.parent_id
        self.events.log("best", best)
        cfg = self.config
        if cfg.memory and cfg.memory_file:
            self.state.memory.save(Path(cfg.memory_file))
        summary = self._end(handed_over=True)
        self.dir.write_summary(summary)
        return summary

    def _end(self, *, handed_over: bool) -> dict[str, Any]:
        """Record that the run ended (``finished``: what ``kernelarc status`` tells a
        finished run from a running or killed one by) and return its summary."""
        self.events.log("finished", {"handed_over": handed_over})
        return run_status(self.store, self.dir.path)

    def _compose(self, passes: list[Pass], best: Pass) -> Pass | None:
        """The shape-gated composition of the per-workload winners, judged in full; None when
        it is not worth judging, not significantly better, or its judgement was cut by a stop
        signal (one that came while it was planned waits for the next judgement)."""
        problem, events = self.problem, self.events
        best_rec, best_ev = best
        gain = predicted_gain(problem.definition, problem.workloads, full_latencies(passes))
        if gain <= 1.0 + COMPOSE_MARGIN * self.config.min_gain:
            events.log(
                "composition_skipped",
                {"why": f"predicted gain {gain:.3f}x over the best single candidate is too small"},
            )
            return None
        try:
            chosen = winners(problem.definition, problem.workloads, passes)
            if len({rec.id for rec in chosen.values()}) < 2:
                return None
            solution = compose(
                problem.definition,
                problem.workloads,
                {u: rec.solution for u, rec in chosen.items()},
                default=best_rec.solution,
            )
        except CompositionError as e:
            events.log("composition_skipped", {"why": str(e)})
            return None
        parts = {rec.id for rec in chosen.values()}
        need, left = self.state.judging_cost(parts), self.clock.left_total()
        if self.clock.timed and need > left:
            # Started, it would be cut by the limit after overrunning it by one workload,
            # and nothing would be kept.
            why = f"{max(left, 0.0):.0f} s left, under the {need:.0f} s its parts took to judge"
            events.log("composition_skipped", {"why": why})
            return None
        # only the judgement is cut: a signal during the planning above waits for it
        judged = events.unless_stopped(
            "composition",
            lambda: self.final.judge(
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
        better = result.passed and significant(
            per, best_ev.result.per_workload, self.config.min_gain
        )
        events.log(
            "composition",
            {
                "candidate": record.id,
                "passed": result.passed,
                "score": result.score,
                "stopped": result.stopped_early,
                "kept": better,
                "parts": sorted(parts),
            },
        )
        return (record, ev) if better else None

    def _fallback(self, reference: Solution, chosen: Pass) -> Pass:
        """The reference judged in full; returned instead of ``chosen`` (which is not
        significantly faster than the reference) whenever it passes, whatever it reads: its
        reading away from 1x is the measurement's noise, and ``chosen`` gained nothing sure.
        ``chosen`` stays only when the reference fails its own judgement (then nothing
        could have been compared with it)."""
        rec, ev = chosen
        ref_rec, ref_ev = self.final.judge(
            reference,
            agent=FALLBACK,
            strategy="reference",
            parent=rec.id,
            hypothesis=f"the reference itself beats {rec.id} ({ev.result.score:.3g}x over eager)",
        )
        kept = ref_ev.result.passed
        self.events.log(
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
        return (ref_rec, ref_ev) if kept else chosen


def winners(
    definition: Definition, workloads: Sequence[Workload], passes: list[Pass]
) -> dict[str, CandidateRecord]:
    """Per workload, the candidate a dispatcher routes it to (``compose.routes``)."""
    by_id = {rec.id: rec for rec, _ in passes}
    chosen = routes(definition, workloads, full_latencies(passes))
    return {u: by_id[cid] for u, cid in chosen.items()}


def full_latencies(passes: list[Pass]) -> dict[str, dict[str, float]]:
    """Candidate id → workload uuid → full-protocol latency (ms), in store order."""
    return {
        rec.id: {r.uuid: r.latency_ms for r in ev.result.per_workload if r.latency_ms}
        for rec, ev in passes
    }


def run_status(store: Store, run_dir: Path) -> dict[str, Any]:
    """The run's state for scripts (names are a contract: see ``kernelarc status``; keys
    are only ever added)."""
    config = _config(store)
    cands = store.candidates()
    evals = store.evaluations()
    conclusions = store.conclusions()
    incumbents = store.incumbents()
    composed = {c.id for c in cands if c.agent == COMPOSER}
    finishers = {c.id for c in cands if c.agent in FINISHERS}
    all_judged = {e.candidate_id for e in evals}
    judged = all_judged - finishers
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
    broken = store.events("reference_broken")
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
        "best": _best(store, run_dir, cands),
        "stopped": (
            store.events("search_stopped")[-1].payload.get("reason")
            if store.events("search_stopped")
            else None
        ),
        "judged_at_end": len(all_judged & finishers),
        "reference_broken": broken[-1].payload.get("error") if broken else None,
        **_progress(store, run_dir),
    }


NO_GAIN = "no candidate was significantly faster than the reference on this machine"
"""What a run that hands the reference back says (summary, ``kernelarc status``, report)."""


def _best(store: Store, run_dir: Path, cands: list[CandidateRecord]) -> dict[str, Any] | None:
    """The handed-over solution: its candidate, agent, the figure its hand-over judgement
    read, and the workloads where that judgement was slower than the reference."""
    best_path = run_dir / "best" / "solution.json"
    events = store.events("best")
    if not (best_path.exists() and events):
        return None
    last = events[-1].payload
    cid = str(last.get("candidate"))
    ev = [e for e in store.evaluations(cid) if e.stage == "full"]
    per = ev[-1].result.per_workload if ev else ()
    itself = last.get("reference")  # None: a run from before it was kept
    agent = next((c.agent for c in cands if c.id == cid), None)
    origin = last.get("confirms")
    return {
        "path": str(best_path),
        "candidate_id": last.get("candidate"),
        "all_passed": bool(ev and ev[-1].result.passed),
        "speedup": ev[-1].result.score if ev else None,
        "is_reference": itself,
        "agent": next((c.agent for c in cands if c.id == origin), agent) if origin else agent,
        "confirms": origin,
        "verdict": NO_GAIN if itself else None,
        "slower_workloads": []
        if itself
        else [
            {"uuid": r.uuid, "axes": dict(r.axes), "speedup": r.speedup}
            for r in per
            if r.speedup is not None and r.speedup < 1.0
        ],
    }


def _progress(store: Store, run_dir: Path) -> dict[str, Any]:
    """Whether the run is still going, and how long it has run. It ``finished`` when its
    latest process logged ``finished`` (each process of a run, resumed or not, logs
    ``run_config`` first); else it is ``running`` while the process holding the store's
    writer lock is alive (its pid is in ``store.sqlite.lock``), and ``stopped`` (killed, or
    cut before its end: ``--resume`` finishes it) otherwise."""
    events = store.events()
    starts = [e for e in events if e.kind == "run_config"]
    last_start = starts[-1].seq if starts else -1
    ended = next((e for e in reversed(events) if e.kind == "finished"), None)
    if ended is not None and ended.seq > last_start:
        state = "finished"
    elif _writer_alive(run_dir / "store.sqlite.lock"):
        state = "running"
    else:
        state = "stopped"
    elapsed = None
    if events:
        first = datetime.fromisoformat(events[0].at)
        end = (
            datetime.now(UTC)
            if state == "running"
            else datetime.fromisoformat((ended if state == "finished" and ended else events[-1]).at)
        )
        elapsed = round(max((end - first).total_seconds(), 0.0), 1)
    return {"state": state, "running": state == "running", "elapsed_s": elapsed}


def _writer_alive(lock: Path) -> bool:
    """Whether the process whose pid the store's writer lock file holds is alive (read
    only: taking the lock to test it could refuse a writer starting at that moment)."""
    try:
        pid = int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def _config(store: Store) -> dict[str, Any]:
    events = store.events("run_config")
    if events:
        return dict(events[-1].payload)
    return {}
