"""The search's use of its time limit: which ready proposal is judged first, which is not
judged at all, when to warn that a full evaluation cannot fit. Functions of the
:class:`~kernelarc.orchestration.orchestrator.Orchestrator` state, which calls them; nothing
here runs without a time limit except the priority order and the first pick's wait for the
agents' first proposals (``RunConfig.first_round_wait_s``). Under one, the pick after the
board's best changed waits briefly for a proposal built on it (``ON_BEST_WAIT_S``).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from kernelarc.agents.types import CandidateResult, Proposal
from kernelarc.orchestration.judge import full_cost_estimate

if TYPE_CHECKING:
    from kernelarc.orchestration.orchestrator import Orchestrator

EXPENSIVE_SHARE = 1 / 16
"""A proposal whose judgement is expected to take over this share of the time limit is
*expensive* (15 s of a 240 s limit): it yields to cheap proposals for a while."""
DEFER_SHARE = 1 / 4
"""How long an expensive proposal yields: until the judging done since it became ready has
taken this share of the time limit (60 s of 240 s), or no cheap proposal is ready."""
NO_TIME_FACTOR = 2.0
"""A proposal whose screening is expected to take over this many times the time left is not
judged (the limit would cut it: nothing learnt, and the run ends past its limit)."""


def gather_first_round(
    orch: Orchestrator, inflight: dict[Future[Any], str], done: set[Future[Any]]
) -> set[Future[Any]]:
    """``done`` and every other proposal in ``inflight`` that becomes ready within the run's
    ``first_round_wait_s``. Called once per process, before its first judgement: the order
    of the first candidates then follows their priorities, not thread timing. On the H200
    (2026-12-03, L2 025, one code tree) the precision agent's TF32 policy was ready at once
    and judged on the reference (96 s) while the rewrite agent was still building its
    grouped-loop proposal (about 2 s on a CPU here), which has the higher priority; the
    240 s limit then left no time for TF32 on the grouped loop (4.55x in the run before,
    where the rewrite happened to be ready first; 1.51x in this one)."""
    rest = set(inflight) - done
    until = time.monotonic() + min(orch.config.first_round_wait_s, max(orch.time_left(), 0.0))
    while rest and (left := until - time.monotonic()) > 0:
        got = orch.executor.wait_any(rest, timeout=left)
        if not got:
            break
        done, rest = done | got, rest - got
    return done


ON_BEST_WAIT_S = 3.0
"""Under a time limit, after the board's best changed, the longest the next pick waits for
a proposal built on it when none of the ready ones is (:func:`gather_on_best`)."""


def gather_on_best(
    orch: Orchestrator, inflight: dict[Future[Any], str], done: set[Future[Any]]
) -> set[Future[Any]]:
    """``done``, and, the first time a pick is made after the board's best changed while no
    ready proposal builds on it, the proposals of agents asked since that change that become
    ready within ``ON_BEST_WAIT_S`` (until one builds on the best). On the H100
    (2026-12-06, L1 017): the precision agent's new best (3.34x) came at 174 s of 240 s; the
    compiler's next configuration of an older base was judged next, the limit cut it, and
    no CUDA graph of that best was judged (in the run before, one took 3.79x to 6.03x).
    Under no time limit, nothing waits."""
    best = orch.board.best() if orch.config.board else None
    if orch.config.time_limit_s is None or best is None or best == orch.best_gathered:
        return done
    if any(builds_on_best(orch, inflight[f], f) for f in done):
        orch.best_gathered = best
        return done
    rest = {
        f
        for f in set(inflight) - done
        if inflight[f] != best[0] and orch.asked.get(inflight[f]) == orch.board.version
    }
    if not rest:  # no agent asked since the change yet: the next pick looks again
        return done
    orch.best_gathered = best
    until = time.monotonic() + min(ON_BEST_WAIT_S, max(orch.time_left(), 0.0))
    while rest and (left := until - time.monotonic()) > 0:
        got = orch.executor.wait_any(rest, timeout=left)
        if not got:
            break
        done, rest = done | got, rest - got
        if any(builds_on_best(orch, inflight[f], f) for f in got):
            break
    return done


def builds_on_best(orch: Orchestrator, name: str, fut: Future[Any]) -> bool:
    """Whether the ready proposal ``fut`` of agent ``name`` has the board's best incumbent
    of another agent as its parent."""
    proposal = fut.result() if fut.exception() is None else None
    best = orch.board.best() if orch.config.board else None
    return (
        isinstance(proposal, Proposal)
        and best is not None
        and best[0] != name
        and proposal.parent_id == best[1]
    )


def judging_order(
    orch: Orchestrator, name: str, fut: Future[Any], ready_at: float
) -> tuple[Any, ...]:
    """Sort key of a ready proposal. A failed or empty one comes first: telling it costs
    nothing, and its agent (one that waits for the board, say) is asked again sooner.
    Without a time limit: its priority (the proposal's own when it sets one, else its
    agent's), then the agents' order. Under one, an
    expensive proposal (``expensive``) first yields to the cheap ones until the judging
    done since it became ready has taken ``DEFER_SHARE`` of the limit: cheap wins are
    measured before a costly judgement, which still comes (never starved by an agent
    that proposes again at once). Then a proposal built on the board's best incumbent of
    *another* agent (its parent) goes first: combining the best found so far is likelier
    to win than one more variant of an agent's own line (H200, L1 017: the compiler's
    next configuration, 62 s, went before the CUDA graph of its new best incumbent,
    whose small workloads sat at a ~0.2 ms launch floor, and the time ran out). Then
    agents take turns (fewest candidates judged first), then priority, then who was
    ready first. A proposal built on that best is not deferred: it is the likeliest win,
    and each cheap one judged before it eats the time its full evaluation needs (H200,
    L2 002: the compile of the best policy waited behind two cheap candidates and a CUDA
    graph, and the limit cut its full evaluation at 5.21x against the winner's 4.19x)."""
    proposal = fut.result() if fut.exception() is None else None
    priority = orch.agents[name].priority
    if isinstance(proposal, Proposal) and proposal.priority is not None:
        priority = proposal.priority
    index = list(orch.agents).index(name)
    to_judge = isinstance(proposal, Proposal)  # False first: nothing to judge
    limit = orch.config.time_limit_s
    if limit is None:
        return (to_judge, -priority, index)
    on_best = builds_on_best(orch, name, fut)
    slow = isinstance(proposal, Proposal) and expensive(orch, name, proposal)
    deferred = slow and not on_best and orch.told_s - ready_at < DEFER_SHARE * limit
    return (
        to_judge,
        deferred,
        not on_best,
        orch.per_agent.get(name, 0),
        -priority,
        ready_at,
        index,
    )


def warn_if_full_too_slow(
    orch: Orchestrator, screened: CandidateResult, screen_s: float, compiles: bool = False
) -> None:
    """Once per run: an event when a complete screening says that one full evaluation
    will not fit in the time left (the run would end without a validated solution).
    Not from a solution that ``compiles`` at run time: its screening is mostly compiling
    (on the H200, L1 017: a 67 s screening predicted 1192 s, and the full evaluation of
    the next compiled candidate then fitted in the 101 s left)."""
    cfg, judge = orch.config, orch.judge
    if cfg.time_limit_s is None or orch.full_cost_warned or not screened.passed or compiles:
        return
    if len(screened.per_workload) < len(judge.screen_set):
        return
    n = len(orch.problem.workloads)
    est = full_cost_estimate(screen_s, n, len(judge.screen_set))
    if est > orch.time_left_total():
        orch.full_cost_warned = True
        fewer = " or judge fewer workloads (--workloads)," if n > 1 else ""
        orch.event(
            "full_protocol_too_slow",
            {
                "estimated_s": round(est),
                "time_left_s": round(max(orch.time_left_total(), 0.0)),
                "why": f"a screening took {screen_s:.0f} s: one full evaluation of {n} "
                f"workload(s) should take about {est:.0f} s; raise --time-limit{fewer} or no "
                "candidate may pass the full protocol",
            },
        )


def expected_screen_s(orch: Orchestrator, name: str, proposal: Proposal) -> float | None:
    """The screening time ``proposal`` is expected to take: its parent's, else its agent's
    last candidate's; None when neither was screened in this process."""
    return orch.screen_cost.get(proposal.parent_id or "", orch.agent_cost.get(name))


def expensive(orch: Orchestrator, name: str, proposal: Proposal) -> bool:
    """Whether judging ``proposal`` is expected (``expected_screen_s``) to take over
    ``EXPENSIVE_SHARE`` of the time limit (never, without one); with no estimate, a solution
    that compiles at run time (torch.compile: a compile per workload shape) is expected to be
    expensive."""
    if orch.config.time_limit_s is None:
        return False
    cost = expected_screen_s(orch, name, proposal)
    if cost is None:
        return proposal.solution.compiles_at_run_time()
    return cost > EXPENSIVE_SHARE * orch.config.time_limit_s


def retire_if_no_time(orch: Orchestrator, name: str, proposal: Proposal) -> bool:
    """Under a time limit, when ``proposal``'s screening is expected (``expected_screen_s``)
    to take over ``NO_TIME_FACTOR`` times the time left: retire its agent, with the reason
    and an event (it would propose the same kind again), and return True (the proposal is
    left unjudged). On
    the H200, FIB 002: a compiled candidate started 12 s before the limit, after three
    of its agent's screenings of 53-61 s, and the run ended 53 s past the limit."""
    if orch.config.time_limit_s is None:
        return False
    cost = expected_screen_s(orch, name, proposal)
    left = max(orch.time_left(), 0.0)
    if cost is None or cost <= NO_TIME_FACTOR * left:
        return False
    orch.retired.add(name)
    why = (
        f"no time for its next candidate: its screening should take ~{cost:.0f} s "
        f"(the last of its kind took that), {left:.0f} s left"
    )
    orch.event("agent_retired", {"agent": name, "why": why})
    return True
