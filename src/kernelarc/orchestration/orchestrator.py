"""The search loop: agents propose in parallel, the guard judges serially, the store keeps
everything, and three switchable mechanisms coordinate the agents (design.md):
conclusions-only shared memory, the read-only board of incumbents, and plateau-triggered
drafting. The orchestrator owns the loop (ask/tell) and is the store's only writer.

Its collaborators each get what they need explicitly: the run's state (``state.py``), the
recorder every event goes through (``events.py``), the clock (``clock.py``), the scheduling
decisions (``schedule.py``), the end of the run (``finish.py``, ``confirm.py``) and the
resume (``resume.py``). None of them imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from kernelarc.agents.base import Agent, Rebasing
from kernelarc.agents.types import (
    AgentContext,
    CandidateResult,
    Conclusion,
    Proposal,
    WorkloadResult,
)
from kernelarc.guard.evaluator import EvalResult
from kernelarc.orchestration.clock import Clock
from kernelarc.orchestration.config import RunConfig
from kernelarc.orchestration.events import Events
from kernelarc.orchestration.executor import Executor, LocalExecutor
from kernelarc.orchestration.final import FinalJudge
from kernelarc.orchestration.finish import Finisher
from kernelarc.orchestration.judge import (
    GuardLike,
    Judge,
    reference_broken,
    significant,
    summarize_stages,
)
from kernelarc.orchestration.resume import ORCHESTRATOR, incumbent_view, restore
from kernelarc.orchestration.rundir import RunDir
from kernelarc.orchestration.schedule import Inflight, Scheduler, reserve
from kernelarc.orchestration.state import RunState
from kernelarc.problem.loader import Problem
from kernelarc.store.base import CandidateRecord, EvaluationRecord, Store

MAX_PROPOSE_ERRORS = 3

Stages = list[tuple[str, EvalResult, CandidateResult]]


class Orchestrator:
    def __init__(
        self,
        problem: Problem,
        agents: list[Agent],
        config: RunConfig,
        run_dir: RunDir,
        store: Store,
        guard: GuardLike,
        bounds: dict[str, float],
        executor: Executor | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.problem, self.config, self.store, self.guard = problem, config, store, guard
        self.bounds = bounds
        self.agents = {a.name: a for a in agents}
        self.state = RunState(
            agents=tuple(a.name for a in agents),
            budget=config.budget,
            budget_per_agent=config.budget_per_agent,
            patience=config.patience,
        )
        self.executor = executor or LocalExecutor(len(agents))
        self.clock = Clock(config.time_limit_s, lambda: reserve(self.state, config, problem))
        memory = self.state.memory if config.memory else None
        self.events = Events(store, run_dir, self.state, memory=memory, on_event=on_event)
        self.judge = Judge(guard, config, bounds, self.clock.left)
        self.schedule = Scheduler(
            self.state,
            config,
            self.clock,
            self.events,
            self.agents,
            self.executor,
            n_workloads=len(problem.workloads),
            n_screened=len(self.judge.screen_set),
            reference_hash=self.judge.reference_hash,
        )
        final = FinalJudge(guard, config, bounds, self.clock, store, run_dir)
        self.finisher = Finisher(problem, config, self.state, self.clock, self.events, final)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        """Search until the budget or the time limit is spent (or every agent is done, or
        Ctrl-C), then finish: best solution, composition, summary. Returns the summary."""
        sigint = self.events.sigint
        sigint.install()
        try:
            return self._run()
        finally:
            sigint.uninstall()

    def _run(self) -> dict[str, Any]:
        self._resume()
        state, sigint = self.state, self.events.sigint
        # From here a stop signal cuts only the search and the end's judgements (each in a
        # ``window``): one that comes between them waits, and the run still hands over.
        with sigint.held():
            try:
                with sigint.window():
                    self._search()
            except KeyboardInterrupt:
                self.events.stopped_by_signal("search")
            finally:
                self.executor.shutdown()
            reason = (
                "interrupted"
                if state.interrupted
                else "the reference is broken"
                if state.reference_broken
                else "budget spent"
                if state.budget_left() <= 0
                else "time limit"
                if self.clock.left() <= 0
                else "every agent is done"
            )
            self.events.log("search_stopped", {"reason": reason, "used": state.used})
            return self.finisher.finish()

    def _resume(self) -> None:
        """Rebuild the state from the store; tell what was judged but not told, and judge
        again what was in flight when an earlier process of the run died."""
        todo = restore(self.config, self.state, self.events, self.agents)
        for rec, result in todo.untold:
            self.state.plateau.record(rec.agent, result.improved)
            self._observe(rec.agent, result, store_conclusion=True)
        for rec in todo.pending:
            if self.state.budget_left() > 0:
                self._judge(rec)

    def _search(self) -> None:
        """Ask, judge, tell until the budget or the time limit is spent or every agent is
        done. One ready proposal is judged at a time, then idle agents are asked again: a
        new incumbent reaches every agent's next proposal before the rest of the ready ones
        are judged (``Scheduler.judging_order``)."""
        state, clock, schedule = self.state, self.clock, self.schedule
        inflight: Inflight = {}
        ready_at: dict[Future[Any], float] = {}  # ``told_s`` when each was first seen ready
        gathered = False  # the first pick is made among every first proposal
        while state.budget_left() > 0 and clock.left() > 0 and state.reference_broken is None:
            self.events.sigint.check()
            for name in self._idle(inflight):
                state.asked[name] = state.board.version
                inflight[self.executor.submit(self.agents[name].propose, self._context(name))] = (
                    name
                )
            if not inflight:
                break
            done = self.executor.wait_any(inflight, timeout=clock.left())
            if not done:
                continue
            if not gathered:
                gathered = True
                done = schedule.gather_first_round(inflight, done)
            done = schedule.gather_on_best(inflight, done)
            for f in done:
                ready_at.setdefault(f, state.told_s)
            fut = min(done, key=lambda f: schedule.judging_order(inflight[f], f, ready_at[f]))
            del ready_at[fut]
            name = inflight.pop(fut)
            t0 = time.monotonic()
            self._tell(name, self._rebased(name, fut))
            state.told_s += time.monotonic() - t0

    def _idle(self, inflight: Inflight) -> list[str]:
        """The agents to ask now: not busy, retired, capped, or waiting for a board that has
        not changed; no more than the budget left for new proposals."""
        state = self.state
        busy = set(inflight.values())
        room = state.budget_left() - len(inflight)
        out: list[str] = []
        for name in self.agents:
            if name in busy or name in state.retired or state.capped(name):
                continue
            if name in state.waiting:
                if state.waiting[name] == state.board.version:
                    continue
                del state.waiting[name]
            if len(out) >= room:
                break
            out.append(name)
        return out

    # ------------------------------------------------------------------ ask
    def _rebased(self, name: str, fut: Future[Any]) -> Future[Any]:
        """``fut``, or a future of the proposal its agent (:class:`Rebasing`) builds instead
        on the board as it is now, when the board changed after the agent was asked."""
        agent, board = self.agents[name], self.state.board
        if not (isinstance(agent, Rebasing) and self.config.board) or fut.exception():
            return fut
        proposal = fut.result()
        if not isinstance(proposal, Proposal) or self.state.asked.get(name) == board.version:
            return fut
        out: Future[Any] = Future()
        try:
            new = agent.rebase(proposal, self._context(name, drafting=False))
        except Exception as e:  # counted and reported as a failed proposal
            out.set_exception(e)
            return out
        if new is None:
            return fut
        was, now = proposal.hypothesis[:300], new.hypothesis[:300]
        self.events.log("rebased", {"agent": name, "board": board.version, "was": was, "now": now})
        out.set_result(new)
        return out

    def _context(self, name: str, drafting: bool = True) -> AgentContext:
        agent, cfg, state = self.agents[name], self.config, self.state
        must_draft = drafting and cfg.drafting and state.plateau.must_draft(name)
        if must_draft:
            state.plateau.reset(name)
            self.events.log("draft_requested", {"agent": name})
        tags = (agent.strategy,)
        return AgentContext(
            problem=self.problem.definition.name,
            definition=self.problem.definition,
            device=self.guard.device,
            bounds_ms=dict(self.bounds),
            workloads=tuple(dict(w.axes) for w in self.problem.workloads),
            scalars=tuple(w.scalar_inputs() for w in self.problem.workloads),
            tolerances=tuple(w.tolerance for w in self.problem.workloads),
            incumbent=state.board.incumbent(name),
            incumbent_results=state.results.get(name, {}).get("full", ()),
            feedback=state.feedback.get(name, ""),
            board=state.board.snapshot() if cfg.board else None,
            conclusions=state.memory.top_k(name, agent.strategy, tags, cfg.memory_top_k)
            if cfg.memory
            else (),
            budget_left=state.budget_left(),
            time_left_s=None if cfg.time_limit_s is None else max(0.0, self.clock.left()),
            must_draft=must_draft,
            round=state.used,
            seed=cfg.seed,
        )

    # ------------------------------------------------------------------ tell
    def _tell(self, name: str, fut: Future[Any]) -> None:
        with self.events.sigint.critical():  # the judgement itself stays interruptible
            record = self._record(name, fut)
        if record is not None:
            self._judge(record, fut.result().reference_point)

    def _record(self, name: str, fut: Future[Any]) -> CandidateRecord | None:
        """The proposal's candidate, stored and written (None when there is nothing to
        judge: an error, no proposal, a duplicate, no time)."""
        state, events = self.state, self.events
        try:
            proposal = fut.result()
        except Exception as e:
            state.errors[name] += 1
            state.feedback[name] = f"your last propose() raised {type(e).__name__}: {e}"
            events.log("propose_error", {"agent": name, "error": repr(e)[:2000]})
            if state.errors[name] >= MAX_PROPOSE_ERRORS:
                state.retired.add(name)
                events.log("agent_retired", {"agent": name, "why": "errors"})
            return None
        if proposal is None:
            others = set(self.agents) - state.retired - set(state.waiting) - {name}
            if self.config.board and self.agents[name].waits_for_board and others:
                state.waiting[name] = state.asked.get(name, state.board.version)
                events.log("agent_waiting", {"agent": name, "board_version": state.waiting[name]})
                return None
            state.retired.add(name)
            events.log("agent_retired", {"agent": name, "why": "nothing to try"})
            return None
        if not isinstance(proposal, Proposal):
            raise TypeError(f"agent {name} returned {type(proposal).__name__}, not a Proposal")
        dup = self.store.candidate_by_hash(proposal.solution.content_hash())
        if dup is not None:
            evals = self.store.evaluations(dup.id)
            if evals:
                cached = evals[-1].result.model_copy(update={"cached": True, "improved": False})
                events.log("duplicate", {"agent": name, "of": dup.id})
                self._observe(name, cached, store_conclusion=False)
                return None
        if self.schedule.retire_if_no_time(name, proposal):
            return None
        record = self.store.add_candidate(
            CandidateRecord(
                id=f"c{len(self.store.candidates()) + 1:04d}-{name}",
                content_hash=proposal.solution.content_hash(),
                agent=name,
                strategy=self.agents[name].strategy,
                mode=proposal.mode,
                parent_id=proposal.parent_id,
                hypothesis=proposal.hypothesis,
                solution=proposal.solution,
            )
        )
        events.dir.write_candidate(record)
        # The agent's state now includes this proposal: a resumed run continues after it.
        self.store.save_agent_state(name, {"agent": self.agents[name].state()})
        if proposal.mode == "draft":
            events.log(
                "draft", {"agent": name, "candidate": record.id, "parent": proposal.parent_id}
            )
        return record

    def _judge(self, record: CandidateRecord, reference_point: bool = False) -> None:
        stages = self.judge.judge(
            record.id, record.agent, record.strategy, record.mode, record.solution,
            self.state.incumbent_screens(), always_full=reference_point,
        )  # fmt: skip
        with self.events.sigint.critical():  # the verdict is recorded whole, or Ctrl-C waits
            self._record_verdict(record, stages)

    def _record_verdict(self, record: CandidateRecord, stages: Stages) -> None:
        name, state = record.agent, self.state
        for _stage, ev, res in stages:
            self.store.add_evaluation(
                EvaluationRecord(
                    candidate_id=record.id, stage=res.stage, traces=ev.traces, result=res
                )
            )
            self.events.dir.append_traces(ev.traces)
        state.count_judged(name)
        # The screening that decided (a crowded-out first attempt is followed by another).
        _, screen_ev, screened = next(s for s in stages if s[0] == "screen")
        final_ev, final = stages[-1][1], stages[-1][2]
        full_pass = final.stage == "full" and final.passed
        full = None
        if full_pass:
            full = (
                final_ev.wall_s,
                {r.uuid: r.latency_ms for r in final.per_workload if r.latency_ms},
            )
        state.record_costs(record.id, name, screen_ev.wall_s, full)
        compiles = record.solution.compiles_at_run_time()
        self.schedule.warn_if_full_too_slow(screened, screen_ev.wall_s, compiles)
        old = state.results.get(name, {}).get("full")
        improved = full_pass and significant(final.per_workload, old, self.config.min_gain)
        if improved:
            self._promote(record, {s: r.per_workload for s, _, r in stages}, final)
        final = final.model_copy(update={"improved": improved})
        state.feedback[name] = "" if final.passed else _failure_text(final)
        state.plateau.record(name, improved)
        self.events.log(
            "evaluated",
            {
                "agent": name,
                "candidate": record.id,
                "improved": improved,
                "stages": summarize_stages(stages),
            },
        )
        self._observe(name, final, store_conclusion=True)
        itself = record.content_hash == self.judge.reference_hash
        error = reference_broken(screened.per_workload, len(self.judge.screen_set), itself)
        if error is not None and state.reference_broken is None:
            state.reference_broken = error
            self.events.log(
                "reference_broken",
                {"error": error, "candidate": record.id, "workloads": len(screened.per_workload)},
            )

    def _promote(
        self,
        record: CandidateRecord,
        per: dict[str, tuple[WorkloadResult, ...]],
        final: CandidateResult,
    ) -> None:
        view = incumbent_view(record, final)
        self.state.board.update(view, owner=record.agent)
        self.store.set_incumbent(view)
        self.state.results[record.agent] = dict(per)
        self.events.log(
            "incumbent", {"agent": record.agent, "candidate": record.id, "score": view.score}
        )

    def _observe(self, name: str, result: CandidateResult, *, store_conclusion: bool) -> None:
        agent = self.agents[name]
        try:
            conclusion = agent.observe(result)
            if not isinstance(conclusion, Conclusion):
                raise TypeError(f"observe() returned {type(conclusion).__name__}")
        except Exception as e:
            self.events.log("observe_error", {"agent": name, "error": repr(e)[:2000]})
            conclusion = Conclusion(
                agent=name,
                strategy=agent.strategy,
                candidate_id=result.candidate_id,
                claim=f"(the agent did not conclude: {type(e).__name__})",
                outcome="failed" if not result.passed else "no_gain",
            )
        if store_conclusion:
            self.events.conclude(conclusion)
        self.store.save_agent_state(name, {"agent": agent.state()})
        self.store.save_agent_state(ORCHESTRATOR, {"plateau": self.state.plateau.state()})


def _failure_text(result: CandidateResult) -> str:
    bad = [r for r in result.per_workload if r.status != "PASSED"]
    if result.stopped_early and not bad:
        return f"stopped early: {result.stopped_early}"
    if not bad:
        return "no workload was judged"
    r = bad[0]
    return f"{r.status} on workload {r.uuid} ({r.axes}): {r.log[:1500]}"
