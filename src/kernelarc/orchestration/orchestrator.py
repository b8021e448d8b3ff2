"""The search loop: agents propose in parallel, the guard judges serially, the store keeps
everything, and three switchable mechanisms coordinate the agents (design.md):
conclusions-only shared memory, the read-only board of incumbents, and plateau-triggered
drafting. The orchestrator owns the loop (ask/tell) and is the store's only writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from kernelarc.agents.base import Agent, Rebasing
from kernelarc.agents.board import Board
from kernelarc.agents.memory import ConclusionMemory
from kernelarc.agents.plateau import PlateauTracker
from kernelarc.agents.types import (
    AgentContext,
    CandidateResult,
    Conclusion,
    Proposal,
    WorkloadResult,
)
from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration.config import RunConfig
from kernelarc.orchestration.confirm import FRESH_SLOWER, draws_at_run_time
from kernelarc.orchestration.executor import Executor, LocalExecutor
from kernelarc.orchestration.interrupts import DeferredInterrupt
from kernelarc.orchestration.judge import Judge, significant, summarize_stages
from kernelarc.orchestration.resume import ORCHESTRATOR, incumbent_view, restore
from kernelarc.orchestration.rundir import RunDir
from kernelarc.orchestration.schedule import (
    gather_first_round,
    gather_on_best,
    judging_order,
    retire_if_no_time,
    warn_if_full_too_slow,
)
from kernelarc.problem.loader import Problem
from kernelarc.store.base import CandidateRecord, EvaluationRecord, Store

MAX_PROPOSE_ERRORS = 3


T = TypeVar("T")


class Orchestrator:
    def __init__(
        self,
        problem: Problem,
        agents: list[Agent],
        config: RunConfig,
        run_dir: RunDir,
        store: Store,
        guard: Guard,
        bounds: dict[str, float],
        executor: Executor | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.problem, self.config, self.dir, self.store = problem, config, run_dir, store
        self.guard, self.bounds = guard, bounds
        self.agents = {a.name: a for a in agents}
        if len(self.agents) != len(agents):
            raise ValueError("agent names must be unique")
        self.executor = executor or LocalExecutor(len(agents))
        self.judge = Judge(guard, config, bounds, self.time_left)
        self.board = Board()
        self.memory = ConclusionMemory()
        self.plateau = PlateauTracker(config.patience)
        self.results: dict[str, dict[str, tuple[WorkloadResult, ...]]] = {}
        """Per agent: the incumbent's per-workload results by stage."""
        self.feedback: dict[str, str] = {}
        self.used = 0
        self.per_agent: dict[str, int] = {n: 0 for n in self.agents}
        self.retired: set[str] = set()
        self.waiting: dict[str, int] = {}
        """Agents (``waits_for_board``) that had nothing to propose: the board version they
        saw; asked again once the board has changed."""
        self.asked: dict[str, int] = {}
        self.best_gathered: tuple[str, str] | None = None
        """The board's best when a pick last waited for proposals built on it
        (``schedule.gather_on_best``)."""
        self.errors: dict[str, int] = {n: 0 for n in self.agents}
        self.told_s = 0.0
        """Seconds spent telling (judging) ready proposals so far in this process; a ready
        proposal's wait is measured on this clock (see ``schedule.judging_order``)."""
        self.screen_cost: dict[str, float] = {}
        """Seconds the screening of each candidate judged in this process took."""
        self.agent_cost: dict[str, float] = {}
        """Per agent: the screening seconds of its latest candidate."""
        self.full_s: dict[str, float] = {}
        """Seconds of the full evaluation of each candidate that passed it (this process)."""
        self.full_ms: dict[str, dict[str, float]] = {}
        """Their full-protocol latencies: candidate → workload uuid → ms."""
        self.full_cost_warned = False
        self.started = time.monotonic()
        self.interrupted = False
        self.sigint = DeferredInterrupt()
        """Ctrl-C waits for the record being written (``interrupts.py``)."""
        self.on_event = on_event

    def event(self, kind: str, payload: dict[str, Any]) -> None:
        """Log an event in the store and mirror it to ``events.jsonl``."""
        with self.sigint.critical():
            ev = self.store.log_event(kind, payload)
            self.dir.append_event(kind, payload, ev.at)
        if self.on_event is not None:
            self.on_event(kind, payload)

    def stopped_by_signal(self, during: str) -> None:
        """Record the stop signal (Ctrl-C, SIGTERM) that cut ``during``: the search, or one
        of the judgements at its end (``finish.py``), which is then abandoned."""
        self.interrupted = True
        self.event(
            "interrupted", {"used": self.used, "signal": self.sigint.received, "during": during}
        )

    def unless_stopped(self, during: str, judgement: Callable[[], T]) -> T | None:
        """``judgement()`` in a window a stop signal may cut (``DeferredInterrupt.window``):
        its result, or None when a signal cut it (recorded as cutting ``during``)."""
        try:
            with self.sigint.window():
                return judgement()
        except KeyboardInterrupt:
            self.stopped_by_signal(during)
            return None

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        """Search until the budget or the time limit is spent (or every agent is done, or
        Ctrl-C), then finish: best solution, composition, summary. Returns the summary."""
        self.sigint.install()
        try:
            return self._run()
        finally:
            self.sigint.uninstall()

    def _run(self) -> dict[str, Any]:
        from kernelarc.orchestration.finish import finish

        restore(self)
        # From here a stop signal cuts only the search and the end's judgements (each in a
        # ``window``): one that comes between them waits, and the run still hands over.
        with self.sigint.held():
            try:
                with self.sigint.window():
                    self._search()
            except KeyboardInterrupt:
                self.stopped_by_signal("search")
            finally:
                self.executor.shutdown()
            reason = (
                "interrupted"
                if self.interrupted
                else "budget spent"
                if self._budget_left() <= 0
                else "time limit"
                if self.time_left() <= 0
                else "every agent is done"
            )
            self.event("search_stopped", {"reason": reason, "used": self.used})
            return finish(self)

    def _search(self) -> None:
        """Ask, judge, tell until the budget or the time limit is spent or every agent is
        done."""
        inflight: dict[Future[Any], str] = {}
        ready_at: dict[Future[Any], float] = {}  # ``told_s`` when each was first seen ready
        gathered = False  # the first pick is made among every first proposal
        while self._budget_left() > 0 and self.time_left() > 0:
            self.sigint.check()
            for name in self._idle(inflight):
                ctx = self._context(name)
                self.asked[name] = self.board.version
                inflight[self.executor.submit(self.agents[name].propose, ctx)] = name
            if not inflight:
                break
            done = self.executor.wait_any(inflight, timeout=self.time_left())
            if not done:
                continue
            if not gathered:
                gathered = True
                done = gather_first_round(self, inflight, done)
            done = gather_on_best(self, inflight, done)
            # One ready proposal is judged at a time, then idle agents are asked again:
            # a new incumbent reaches every agent's next proposal before the rest of the
            # ready ones are judged (see ``schedule.judging_order``).
            for f in done:
                ready_at.setdefault(f, self.told_s)
            fut = min(done, key=lambda f: judging_order(self, inflight[f], f, ready_at[f]))
            del ready_at[fut]
            name = inflight.pop(fut)
            t0 = time.monotonic()
            self._tell(name, self._rebased(name, fut))
            self.told_s += time.monotonic() - t0

    def _idle(self, inflight: dict[Future[Any], str]) -> list[str]:
        busy = set(inflight.values())
        room = self._budget_left() - len(inflight)
        out: list[str] = []
        for name in self.agents:
            cap = self.config.budget_per_agent
            if name in busy or name in self.retired or (cap and self.per_agent[name] >= cap):
                continue
            if name in self.waiting:
                if self.waiting[name] == self.board.version:
                    continue
                del self.waiting[name]
            if len(out) >= room:
                break
            out.append(name)
        return out

    def _budget_left(self) -> int:
        return self.config.budget - self.used

    def time_left(self) -> float:
        """Seconds left to the search: the time limit less what has run, less the time kept
        for the final composition (``reserve``)."""
        return self.time_left_total() - self.reserve()

    def time_left_total(self) -> float:
        if self.config.time_limit_s is None:
            return 1e9
        return self.config.time_limit_s - (time.monotonic() - self.started)

    def reserve(self) -> float:
        """Time kept for the end of the run: for the final shape-gated composition once it is
        worth judging (two full passes whose per-workload winners would beat the best single
        one, see ``finish.COMPOSE_MARGIN``), the longest judgement (screening and full stage)
        among them, the likeliest cost of judging the composition; and for the confirmation
        of the board's best incumbent (``confirm.py``), ``FRESH_SLOWER`` times its own
        judgement's time, when that solution can draw at run time
        (``confirm.draws_at_run_time``). Without a time limit, nothing."""
        cfg = self.config
        if cfg.time_limit_s is None:
            return 0.0
        best = self.board.best() if cfg.confirm else None
        view = self.board.incumbent(best[0]) if best else None
        keep = 0.0
        if best and view is not None and draws_at_run_time(view.solution):
            keep = FRESH_SLOWER * self.judging_cost({best[1]})
        return keep + self._compose_reserve()

    def _compose_reserve(self) -> float:
        from kernelarc.orchestration.compose import predicted_gain
        from kernelarc.orchestration.finish import COMPOSE_MARGIN

        cfg = self.config
        if not cfg.compose or len(self.full_s) < 2:
            return 0.0
        p = self.problem
        gain = predicted_gain(p.definition, p.workloads, self.full_ms)
        if gain <= 1.0 + COMPOSE_MARGIN * cfg.min_gain:
            return 0.0
        return self.judging_cost(set(self.full_s))

    def judging_cost(self, parts: set[str]) -> float:
        """The likeliest cost (seconds) of judging a composition of ``parts`` (candidate ids):
        the longest of their judgements, screening and full stage together. The composition
        is judged in a new worker, where a compiled part compiles again (its own stages
        shared one worker). 0 when none of them was judged in this process."""
        return max(
            (t + self.screen_cost.get(c, 0.0) for c, t in self.full_s.items() if c in parts),
            default=0.0,
        )

    # ------------------------------------------------------------------ ask
    def _rebased(self, name: str, fut: Future[Any]) -> Future[Any]:
        """``fut``, or a future of the proposal its agent (:class:`Rebasing`) builds instead
        on the board as it is now, when the board changed after the agent was asked."""
        agent = self.agents[name]
        if not (isinstance(agent, Rebasing) and self.config.board) or fut.exception():
            return fut
        proposal = fut.result()
        if not isinstance(proposal, Proposal) or self.asked.get(name) == self.board.version:
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
        self.event("rebased", {"agent": name, "board": self.board.version, "was": was, "now": now})
        out.set_result(new)
        return out

    def _context(self, name: str, drafting: bool = True) -> AgentContext:
        agent, cfg = self.agents[name], self.config
        must_draft = drafting and cfg.drafting and self.plateau.must_draft(name)
        if must_draft:
            self.plateau.reset(name)
            self.event("draft_requested", {"agent": name})
        inc = self.board.incumbent(name)
        tags = (agent.strategy,)
        return AgentContext(
            problem=self.problem.definition.name,
            definition=self.problem.definition,
            device=self.guard.device,
            bounds_ms=dict(self.bounds),
            workloads=tuple(dict(w.axes) for w in self.problem.workloads),
            scalars=tuple(w.scalar_inputs() for w in self.problem.workloads),
            tolerances=tuple(w.tolerance for w in self.problem.workloads),
            incumbent=inc,
            incumbent_results=self.results.get(name, {}).get("full", ()),
            feedback=self.feedback.get(name, ""),
            board=self.board.snapshot() if cfg.board else None,
            conclusions=self.memory.top_k(name, agent.strategy, tags, cfg.memory_top_k)
            if cfg.memory
            else (),
            budget_left=self._budget_left(),
            time_left_s=None if cfg.time_limit_s is None else max(0.0, self.time_left()),
            must_draft=must_draft,
            round=self.used,
            seed=cfg.seed,
        )

    # ------------------------------------------------------------------ tell
    def _tell(self, name: str, fut: Future[Any]) -> None:
        with self.sigint.critical():  # the judgement itself stays interruptible
            record = self._record(name, fut)
        if record is not None:
            self._judge(record, fut.result().reference_point)

    def _record(self, name: str, fut: Future[Any]) -> CandidateRecord | None:
        """The proposal's candidate, stored and written (None when there is nothing to
        judge: an error, no proposal, a duplicate)."""
        try:
            proposal = fut.result()
        except Exception as e:
            self.errors[name] += 1
            self.feedback[name] = f"your last propose() raised {type(e).__name__}: {e}"
            self.event("propose_error", {"agent": name, "error": repr(e)[:2000]})
            if self.errors[name] >= MAX_PROPOSE_ERRORS:
                self.retired.add(name)
                self.event("agent_retired", {"agent": name, "why": "errors"})
            return None
        if proposal is None:
            others = set(self.agents) - self.retired - set(self.waiting) - {name}
            if self.config.board and self.agents[name].waits_for_board and others:
                self.waiting[name] = self.asked.get(name, self.board.version)
                self.event("agent_waiting", {"agent": name, "board_version": self.waiting[name]})
                return None
            self.retired.add(name)
            self.event("agent_retired", {"agent": name, "why": "nothing to try"})
            return None
        if not isinstance(proposal, Proposal):
            raise TypeError(f"agent {name} returned {type(proposal).__name__}, not a Proposal")
        dup = self.store.candidate_by_hash(proposal.solution.content_hash())
        if dup is not None:
            evals = self.store.evaluations(dup.id)
            if evals:
                cached = evals[-1].result.model_copy(update={"cached": True, "improved": False})
                self.event("duplicate", {"agent": name, "of": dup.id})
                self._observe(name, cached, store_conclusion=False)
                return None
        if retire_if_no_time(self, name, proposal):
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
        self.dir.write_candidate(record)
        # The agent's state now includes this proposal: a resumed run continues after it.
        self.store.save_agent_state(name, {"agent": self.agents[name].state()})
        if proposal.mode == "draft":
            self.event(
                "draft", {"agent": name, "candidate": record.id, "parent": proposal.parent_id}
            )
        return record

    def _judge(self, record: CandidateRecord, reference_point: bool = False) -> None:
        name = record.agent
        screens = [r["screen"] for r in self.results.values() if "screen" in r]
        stages = self.judge.judge(
            record.id, name, record.strategy, record.mode, record.solution, screens,
            always_full=reference_point,
        )  # fmt: skip
        with self.sigint.critical():  # the verdict is recorded whole, or Ctrl-C waits
            self._record_verdict(record, stages)

    def _record_verdict(
        self, record: CandidateRecord, stages: list[tuple[str, Any, CandidateResult]]
    ) -> None:
        name = record.agent
        for _stage, ev, res in stages:
            self.store.add_evaluation(
                EvaluationRecord(
                    candidate_id=record.id, stage=res.stage, traces=ev.traces, result=res
                )
            )
            self.dir.append_traces(ev.traces)
        self.used += 1
        self.per_agent[name] = self.per_agent.get(name, 0) + 1
        # The screening that decided (a crowded-out first attempt is followed by another).
        _, screen_ev, screened = next(s for s in stages if s[0] == "screen")
        self.screen_cost[record.id] = self.agent_cost[name] = screen_ev.wall_s
        warn_if_full_too_slow(
            self, screened, screen_ev.wall_s, record.solution.compiles_at_run_time()
        )
        final = stages[-1][2]
        if final.stage == "full" and final.passed:
            self.full_s[record.id] = stages[-1][1].wall_s
            self.full_ms[record.id] = {
                r.uuid: r.latency_ms for r in final.per_workload if r.latency_ms
            }
        old = self.results.get(name, {}).get("full")
        improved = (
            final.stage == "full"
            and final.passed
            and significant(final.per_workload, old, self.config.min_gain)
        )
        if improved:
            self._promote(record, {s: r.per_workload for s, _, r in stages}, final)
        final = final.model_copy(update={"improved": improved})
        self.feedback[name] = "" if final.passed else _failure_text(final)
        self.plateau.record(name, improved)
        self.event(
            "evaluated",
            {
                "agent": name,
                "candidate": record.id,
                "improved": improved,
                "stages": summarize_stages(stages),
            },
        )
        self._observe(name, final, store_conclusion=True)

    def _promote(
        self,
        record: CandidateRecord,
        per: dict[str, tuple[WorkloadResult, ...]],
        final: CandidateResult,
    ) -> None:
        view = incumbent_view(record, final)
        self.board.update(view, owner=record.agent)
        self.store.set_incumbent(view)
        self.results[record.agent] = dict(per)
        self.event(
            "incumbent", {"agent": record.agent, "candidate": record.id, "score": view.score}
        )

    def _observe(self, name: str, result: CandidateResult, *, store_conclusion: bool) -> None:
        agent = self.agents[name]
        try:
            conclusion = agent.observe(result)
            if not isinstance(conclusion, Conclusion):
                raise TypeError(f"observe() returned {type(conclusion).__name__}")
        except Exception as e:
            self.event("observe_error", {"agent": name, "error": repr(e)[:2000]})
            conclusion = Conclusion(
                agent=name,
                strategy=agent.strategy,
                candidate_id=result.candidate_id,
                claim=f"(the agent did not conclude: {type(e).__name__})",
                outcome="failed" if not result.passed else "no_gain",
            )
        if store_conclusion:
            self._remember(self.store.add_conclusion(conclusion))
        self.store.save_agent_state(name, {"agent": agent.state()})
        self.store.save_agent_state(ORCHESTRATOR, {"plateau": self.plateau.state()})

    def conclude(self, conclusion: Conclusion) -> None:
        """Store a conclusion and put it in the shared memory (a finisher's lesson)."""
        self._remember(self.store.add_conclusion(conclusion))

    def _remember(self, conclusion: Conclusion) -> None:
        """Into the shared memory, when it is on; a claim that looks like code is refused
        there (the store keeps every conclusion)."""
        if not self.config.memory:
            return
        try:
            self.memory.add(conclusion)
        except ValueError as e:
            self.event("conclusion_rejected", {"agent": conclusion.agent, "why": str(e)})


def _failure_text(result: CandidateResult) -> str:
    bad = [r for r in result.per_workload if r.status != "PASSED"]
    if result.stopped_early and not bad:
        return f"stopped early: {result.stopped_early}"
    if not bad:
        return "no workload was judged"
    r = bad[0]
    return f"{r.status} on workload {r.uuid} ({r.axes}): {r.log[:1500]}"
