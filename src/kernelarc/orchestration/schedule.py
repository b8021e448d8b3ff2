"""The search's use of its time limit: which ready proposal is judged first, which is not
judged at all, when to warn that a full evaluation cannot fit, and what time the search
keeps for the run's end (:func:`reserve`). :class:`Scheduler` reads and changes the run's
state (``state.py``) and logs through ``events.py``; nothing here runs without a time limit
except the priority order and the first pick's wait for the agents' first proposals
(``RunConfig.first_round_wait_s``). Under one, the pick after the board's best changed waits
briefly for a proposal built on it (``ON_BEST_WAIT_S``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from kernelarc.agents.base import Agent
from kernelarc.agents.types import CandidateResult, Proposal
from kernelarc.orchestration.clock import Clock
from kernelarc.orchestration.compose import COMPOSE_MARGIN, predicted_gain
from kernelarc.orchestration.config import RunConfig
from kernelarc.orchestration.confirm import FRESH_SLOWER, draws_at_run_time
from kernelarc.orchestration.events import Events
from kernelarc.orchestration.executor import Executor
from kernelarc.orchestration.judge import full_cost_estimate
from kernelarc.orchestration.state import RunState
from kernelarc.problem.loader import Problem

EXPENSIVE_SHARE = 1 / 16
"""A proposal whose judgement is expected to take over this share of the time limit is
*expensive* (15 s of a 240 s limit): it yields to cheap proposals for a while."""
DEFER_SHARE = 1 / 4
"""How long an expensive proposal yields: until the judging done since it became ready has
taken this share of the time limit (60 s of 240 s), or no cheap proposal is ready."""
NO_TIME_FACTOR = 2.0
"""A proposal whose screening is expected to take over this many times the time left is not
judged (the limit would cut it: nothing learnt, and the run ends past its limit)."""
ON_BEST_WAIT_S = 3.0
"""Under a time limit, after the board's best changed, the longest the next pick waits for
a proposal built on it when none of the ready ones is (:meth:`Scheduler.gather_on_best`)."""

Inflight = dict[Future[Any], str]
"""Proposals being made: each future and its agent's name."""


def reserve(state: RunState, config: RunConfig, problem: Problem) -> float:
    """Time kept for the end of the run: for the final shape-gated composition once it is
    worth judging (two full passes whose per-workload winners would beat the best single
    one, see ``compose.COMPOSE_MARGIN``), the longest judgement (screening and full stage)
    among them, the likeliest cost of judging the composition; and for the confirmation of
    the board's best incumbent (``confirm.py``), ``FRESH_SLOWER`` times its own judgement's
    time, when that solution compiles or autotunes on its first call
    (``confirm.draws_at_run_time``). Without a time limit, nothing."""
    if config.time_limit_s is None:
        return 0.0
    best = state.board.best() if config.confirm else None
    view = state.board.incumbent(best[0]) if best else None
    keep = 0.0
    if best and view is not None and draws_at_run_time(view.solution):
        keep = FRESH_SLOWER * state.judging_cost({best[1]})
    return keep + _compose_reserve(state, config, problem)


def _compose_reserve(state: RunState, config: RunConfig, problem: Problem) -> float:
    if not config.compose or len(state.full_s) < 2:
        return 0.0
    gain = predicted_gain(problem.definition, problem.workloads, state.full_ms)
    if gain <= 1.0 + COMPOSE_MARGIN * config.min_gain:
        return 0.0
    return state.judging_cost(state.full_s)


class Scheduler:
    """The search's scheduling decisions (module docstring), on the run's ``state``."""

    def __init__(
        self,
        state: RunState,
        config: RunConfig,
        clock: Clock,
        events: Events,
        agents: Mapping[str, Agent],
        executor: Executor,
        n_workloads: int,
        n_screened: int,
        reference_hash: str | None = None,
    ) -> None:
        self.state, self.config, self.clock, self.events = state, config, clock, events
        self.agents, self.executor = agents, executor
        self.n_workloads, self.n_screened = n_workloads, n_screened
        self.reference_hash = reference_hash
        """The content hash of the problem's reference as a solution (``checks_reference``)."""

    def gather_first_round(self, inflight: Inflight, done: set[Future[Any]]) -> set[Future[Any]]:
        """``done`` and every other proposal in ``inflight`` that becomes ready within the
        run's ``first_round_wait_s``. Called once per process, before its first judgement:
        the order of the first candidates then follows their priorities, not thread timing
        (a proposal that is ready at once would otherwise be judged before one of higher
        priority that takes a second longer to build, and under a time limit that first
        judgement can decide what the run has time for)."""
        rest = set(inflight) - done
        wait = min(self.config.first_round_wait_s, max(self.clock.left(), 0.0))
        until = time.monotonic() + wait
        while rest and (left := until - time.monotonic()) > 0:
            got = self.executor.wait_any(rest, timeout=left)
            if not got:
                break
            done, rest = done | got, rest - got
        return done

    def gather_on_best(self, inflight: Inflight, done: set[Future[Any]]) -> set[Future[Any]]:
        """``done``, and, the first time a pick is made after the board's best changed while
        no ready proposal builds on it, the proposals of agents asked since that change that
        become ready within ``ON_BEST_WAIT_S`` (until one builds on the best): otherwise an
        older line's next candidate goes first and, under a limit, the new best may never be
        built on. Under no time limit, nothing waits."""
        state = self.state
        best = state.board.best() if self.config.board else None
        if self.config.time_limit_s is None or best is None or best == state.best_gathered:
            return done
        if any(self.builds_on_best(inflight[f], f) for f in done):
            state.best_gathered = best
            return done
        rest = {
            f
            for f in set(inflight) - done
            if inflight[f] != best[0] and state.asked.get(inflight[f]) == state.board.version
        }
        if not rest:  # no agent asked since the change yet: the next pick looks again
            return done
        state.best_gathered = best
        until = time.monotonic() + min(ON_BEST_WAIT_S, max(self.clock.left(), 0.0))
        while rest and (left := until - time.monotonic()) > 0:
            got = self.executor.wait_any(rest, timeout=left)
            if not got:
                break
            done, rest = done | got, rest - got
            if any(self.builds_on_best(inflight[f], f) for f in got):
                break
        return done

    def builds_on_best(self, name: str, fut: Future[Any]) -> bool:
        """Whether the ready proposal ``fut`` of agent ``name`` has the board's best
        incumbent of another agent as its parent."""
        proposal = fut.result() if fut.exception() is None else None
        best = self.state.board.best() if self.config.board else None
        return (
            isinstance(proposal, Proposal)
            and best is not None
            and best[0] != name
            and proposal.parent_id == best[1]
        )

    def judging_order(self, name: str, fut: Future[Any], ready_at: float) -> tuple[Any, ...]:
        """Sort key of a ready proposal. A failed or empty one comes first: telling it costs
        nothing, and its agent (one that waits for the board, say) is asked again sooner. Then the
        reference's own code when a candidate failed and none passed yet (``checks_reference``).
        Without a time limit: its priority (the proposal's own when it sets one, else its agent's),
        then the agents' order. Under one, an expensive proposal (``expensive``) first yields to the
        cheap ones until the judging done since it became ready has taken ``DEFER_SHARE`` of the
        limit: cheap wins are measured before a costly judgement, which still comes (never starved
        by an agent that proposes again at once). Then a proposal built on the board's best
        incumbent of *another* agent (its parent) goes first: combining the best found so far is
        likelier to win than one more variant of an agent's own line. Then agents take turns (fewest
        candidates judged first), then priority, then who was ready first. A proposal built on that
        best is not deferred: it is the likeliest win, and each cheap one judged before it eats the
        time its full evaluation needs."""
        proposal = fut.result() if fut.exception() is None else None
        first = not self.checks_reference(proposal)
        priority = self.agents[name].priority
        if isinstance(proposal, Proposal) and proposal.priority is not None:
            priority = proposal.priority
        index = list(self.agents).index(name)
        to_judge = isinstance(proposal, Proposal)  # False first: nothing to judge
        limit = self.config.time_limit_s
        if limit is None:
            return (to_judge, first, -priority, index)
        on_best = self.builds_on_best(name, fut)
        slow = isinstance(proposal, Proposal) and self.expensive(name, proposal)
        deferred = slow and not on_best and self.state.told_s - ready_at < DEFER_SHARE * limit
        return (
            to_judge,
            first,
            deferred,
            not on_best,
            self.state.per_agent.get(name, 0),
            -priority,
            ready_at,
            index,
        )

    def checks_reference(self, proposal: object) -> bool:
        """Whether ``proposal`` is the reference's own code and should be judged before the
        other ready proposals: a candidate has failed and none has passed yet, so the
        reference may be broken, and its own screening tells (``judge.reference_broken``)
        before the budget goes to candidates that cannot be verified."""
        state = self.state
        return (
            isinstance(proposal, Proposal)
            and self.reference_hash is not None
            and proposal.solution.content_hash() == self.reference_hash
            and not state.results
            and any(state.feedback.values())
        )

    def warn_if_full_too_slow(
        self, screened: CandidateResult, screen_s: float, compiles: bool = False
    ) -> None:
        """Once per run: an event when a complete screening says that one full evaluation
        will not fit in the time left (the run would end without a validated solution).
        Not from a solution that ``compiles`` at run time: its screening is mostly compiling,
        which the full stage does not pay again."""
        state = self.state
        if self.config.time_limit_s is None or state.full_cost_warned or not screened.passed:
            return
        if compiles or len(screened.per_workload) < self.n_screened:
            return
        n = self.n_workloads
        est = full_cost_estimate(screen_s, n, self.n_screened)
        if est > self.clock.left_total():
            state.full_cost_warned = True
            fewer = " or judge fewer workloads (--workloads)," if n > 1 else ""
            self.events.log(
                "full_protocol_too_slow",
                {
                    "estimated_s": round(est),
                    "time_left_s": round(max(self.clock.left_total(), 0.0)),
                    "why": f"a screening took {screen_s:.0f} s: one full evaluation of {n} "
                    f"workload(s) should take about {est:.0f} s; raise --time-limit{fewer} or "
                    "no candidate may pass the full protocol",
                },
            )

    def expected_screen_s(self, name: str, proposal: Proposal) -> float | None:
        """The screening time ``proposal`` is expected to take: its parent's, else its
        agent's last candidate's; None when neither was screened in this process."""
        state = self.state
        return state.screen_cost.get(proposal.parent_id or "", state.agent_cost.get(name))

    def expensive(self, name: str, proposal: Proposal) -> bool:
        """Whether judging ``proposal`` is expected (``expected_screen_s``) to take over
        ``EXPENSIVE_SHARE`` of the time limit (never, without one); with no estimate, a
        solution that compiles at run time (torch.compile: a compile per workload shape) is
        expected to be expensive."""
        if self.config.time_limit_s is None:
            return False
        cost = self.expected_screen_s(name, proposal)
        if cost is None:
            return proposal.solution.compiles_at_run_time()
        return cost > EXPENSIVE_SHARE * self.config.time_limit_s

    def retire_if_no_time(self, name: str, proposal: Proposal) -> bool:
        """Under a time limit, when ``proposal``'s screening is expected
        (``expected_screen_s``) to take over ``NO_TIME_FACTOR`` times the time left: retire
        its agent, with the reason and an event (it would propose the same kind again), and
        return True (the proposal is left unjudged: started, it would end the run past its
        limit)."""
        if self.config.time_limit_s is None:
            return False
        cost = self.expected_screen_s(name, proposal)
        left = max(self.clock.left(), 0.0)
        if cost is None or cost <= NO_TIME_FACTOR * left:
            return False
        self.state.retired.add(name)
        why = (
            f"no time for its next candidate: its screening should take ~{cost:.0f} s "
            f"(the last of its kind took that), {left:.0f} s left"
        )
        self.events.log("agent_retired", {"agent": name, "why": why})
        return True
