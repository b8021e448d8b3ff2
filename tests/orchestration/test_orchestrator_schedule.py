"""The orchestrator's budget and use of time, end to end on the CPU: the budget spent exactly
(in all and per agent); which ready proposal is judged first
(priorities, the first round's wait, cheap before run-time compiles under a limit, taking
turns, building on another agent's best, rebasing a deferred proposal), the time kept for
the composition, candidates not judged when their screening cannot fit, the one-time
warning that a full evaluation cannot fit, finishers that stop early.

Every search is real: one ``Guard`` per module judges RMSNorm variants of the bundled
example ``rmsnorm_h512``, a real ``SQLiteStore`` and ``RunDir`` keep the run; the agents are
scripted fakes (``kernelarc.proposers.scripted``), as in ``test_orchestrator.py`` (the
harness is ``tests/data/orchestrator/``).

Not covered: a search cut by its time limit in the judge (test_judge_time_limit.py), agents
that never return (test_executor.py), CUDA.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from data.orchestrator.harness import (
    WAIT_S,
    example_guard,
    example_problem,
    fails,
    rms,
    run_config,
    search,
)

from kernelarc.agents.base import Rebasing
from kernelarc.agents.types import AgentContext, Proposal
from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration import schedule
from kernelarc.orchestration.finish import COMPOSER
from kernelarc.orchestration.judge import TIME_LIMIT
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.loader import Problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.store.sqlite import SQLiteStore

# ---------------------------------------------------------------- fixtures


problem = pytest.fixture(scope="module")(example_problem)
guard = pytest.fixture(scope="module")(example_guard)


# ---------------------------------------------------------------- 1. budget


def test_budget_is_spent_exactly(guard: Guard, problem: Problem, tmp_path: Path) -> None:
    a = ScriptedAgent([rms("ba0"), *fails("ba_f", 4)], name="A")
    b = ScriptedAgent(fails("bb_f", 5), name="B")
    run = search(guard, problem, tmp_path, [a, b], budget=3)
    info = run.describe()
    agent_cands = [c for c in run.candidates if c.agent != COMPOSER]
    assert len(agent_cands) == 3, info
    judged = {e.candidate_id for e in run.evaluations if not e.candidate_id.endswith(COMPOSER)}
    assert judged == {c.id for c in agent_cands}, info
    assert run.summary["evaluated"] == 3, info
    assert run.summary["budget"] == 3, info
    assert run.judged() == [c.id for c in agent_cands], info
    assert run.payloads("search_stopped") == [{"reason": "budget spent", "used": 3}], info
    # Proposals are only asked for while budget is left for them: none is thrown away.
    assert len(a.contexts) + len(b.contexts) == 3, info
    assert len(a.results) + len(b.results) == 3, info
    assert len(run.conclusions) == 3, info


def test_budget_per_agent_is_honoured(guard: Guard, problem: Problem, tmp_path: Path) -> None:
    a = ScriptedAgent(fails("pa_f", 5), name="A")
    b = ScriptedAgent(fails("pb_f", 5), name="B")
    run = search(guard, problem, tmp_path, [a, b], budget=10, budget_per_agent=2)
    info = run.describe()
    assert [c.agent for c in run.candidates].count("A") == 2, info
    assert [c.agent for c in run.candidates].count("B") == 2, info
    assert run.summary["evaluated"] == 4, info
    assert len(a.contexts) == len(b.contexts) == 2, info
    assert run.payloads("search_stopped") == [{"reason": "every agent is done", "used": 4}], info
    assert run.summary["best"] is None and run.payloads("no_solution"), info


class Ranked(ScriptedAgent):
    """A scripted agent of class priority 10 (ScriptedAgent's is 0)."""

    priority = 10


def together(
    gate: threading.Barrier, solution: Solution, priority: int | None = None
) -> Callable[[AgentContext], Proposal]:
    """A scripted step that returns ``solution`` when every party of ``gate`` has arrived:
    proposals that become ready at the same moment."""

    def step(context: AgentContext) -> Proposal:
        gate.wait()
        return Proposal(solution=solution, hypothesis=solution.name, priority=priority)

    return step


def test_proposal_priority_orders_proposals_ready_together(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """Both agents' first proposals are returned at the same moment (a barrier). A's class
    priority (10) is above B's (0), so without proposal priorities A is judged first; B's
    proposal sets priority 50, so B is judged first."""
    gate = threading.Barrier(2, timeout=WAIT_S)
    a = Ranked([together(gate, rms("pa", fail=True))], name="A")
    b = ScriptedAgent([together(gate, rms("pb", fail=True), priority=50)], name="B")
    run = search(guard, problem, tmp_path, [a, b], budget=2)
    info = run.describe()
    assert [c.agent for c in run.candidates] == ["B", "A"], info
    assert run.judged() == [c.id for c in run.candidates], info


def later(delay_s: float, solution: Solution, priority: int | None = None) -> Callable[..., Any]:
    """A scripted step that returns ``solution`` after ``delay_s`` of building it."""

    def step(context: AgentContext) -> Proposal:
        time.sleep(delay_s)
        return Proposal(solution=solution, hypothesis=solution.name, priority=priority)

    return step


@pytest.mark.parametrize("wait_s", [10.0, 0.0])
def test_the_first_pick_waits_for_the_first_proposals(
    guard: Guard,
    problem: Problem,
    tmp_path: Path,
    wait_s: float,
) -> None:
    """A's first proposal (class priority 10) is ready at once; B's, with priority 50, takes
    0.5 s to build. The first judgement waits for the first proposals (up to
    the run's ``first_round_wait_s``), so B is judged first; with no wait, A's, ready alone,
    is."""
    a = Ranked([rms("fa", fail=True)], name="A")
    b = ScriptedAgent([later(0.5, rms("fb", fail=True), priority=50)], name="B")
    run = search(
        guard, problem, tmp_path, [a, b], budget=2, time_limit_s=3600.0, first_round_wait_s=wait_s
    )
    order = "".join(c.agent for c in run.candidates)
    assert order == ("BA" if wait_s else "AB"), run.describe()


@pytest.mark.parametrize("case", ["no limit", "limit", "limit, deferral spent"])
def test_under_a_time_limit_cheap_proposals_go_before_run_time_compiles(
    guard: Guard, problem: Problem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A (class priority 10) and B (0) return together; A's solution mentions torch.compile,
    so with no judging cost observed yet it is expected to compile per workload shape. With
    no time limit, priority decides (A first). Under one, the cheap B goes first, and B's
    next proposal (ready only after that) too while A's deferral lasts (a quarter of the
    limit: 900 s here); once the judging since A became ready has taken that share, A goes
    before B's second (deferred, not starved: A has had no turn yet)."""
    from kernelarc.orchestration import schedule

    if case == "limit, deferral spent":
        monkeypatch.setattr(schedule, "DEFER_SHARE", 1e-9)
    gate = threading.Barrier(2, timeout=WAIT_S)

    compiled = rms("tc", fail=True)
    compiled.sources[0].content += "\n# torch.compile(run) would go here\n"
    assert compiled.compiles_at_run_time() and not rms("x").compiles_at_run_time()
    a = Ranked([together(gate, compiled)], name="A")
    b = ScriptedAgent([together(gate, rms("tb", fail=True)), rms("tb2", fail=True)], name="B")
    limit = None if case == "no limit" else 3600.0
    run = search(guard, problem, tmp_path, [a, b], budget=3, time_limit_s=limit)
    order = [c.agent for c in run.candidates]
    expected = {"no limit": "ABB", "limit": "BBA", "limit, deferral spent": "BAB"}[case]
    assert order == list(expected), run.describe()


class Rebaser(Ranked, Rebasing):
    """A scripted agent whose pending proposal ``rebase`` replaces by ``replacement`` (or
    raises, with ``raises``); it records the contexts it was shown."""

    def __init__(self, steps: list[Any], replacement: Solution, raises: bool = False) -> None:
        super().__init__(steps, name="A")
        self.replacement, self.raises = replacement, raises
        self.rebase_contexts: list[AgentContext] = []

    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        self.rebase_contexts.append(context)
        if self.raises:
            raise RuntimeError("rebase fails on purpose")
        return Proposal(solution=self.replacement, hypothesis="rebased on the board")


@pytest.mark.parametrize("raises", [False, True])
def test_a_deferred_proposal_is_rebased_when_the_board_changed(
    guard: Guard, problem: Problem, tmp_path: Path, raises: bool
) -> None:
    """A's expensive proposal (it compiles) waits while B's cheap one is judged and becomes
    B's incumbent; when A's turn comes the board has changed since A was asked, so A is asked
    to rebase (it sees B's incumbent) and its replacement is what gets judged. A rebase that
    raises is a failed proposal: reported, nothing judged for it."""
    gate = threading.Barrier(2, timeout=WAIT_S)
    compiled = rms("rc", fail=True)
    compiled.sources[0].content += "\n# torch.compile(run) would go here\n"
    a = Rebaser([together(gate, compiled)], rms("rr", fail=True), raises=raises)
    b = ScriptedAgent([together(gate, rms("rb"))], name="B")
    run = search(guard, problem, tmp_path, [a, b], budget=3, time_limit_s=3600.0)
    info = run.describe()
    assert [c.agent for c in run.candidates] == (["B"] if raises else ["B", "A"]), info
    assert len(a.rebase_contexts) == 1, info
    board = a.rebase_contexts[0].board
    assert board is not None and [v.agent for v in board.incumbents] == ["B"], info
    if raises:
        assert "rebase fails on purpose" in run.payloads("propose_error")[0]["error"], info
        assert not run.payloads("rebased"), info
    else:
        assert run.candidates[1].solution.name == "rms_rr", info
        assert run.payloads("rebased")[0]["now"] == "rebased on the board", info


@pytest.mark.parametrize("time_limit", [None, 3600.0])
def test_under_a_time_limit_agents_take_turns(
    guard: Guard, problem: Problem, tmp_path: Path, time_limit: float | None
) -> None:
    """A (class priority 10) proposes again at once after its first verdict; B's (0) first
    proposal was ready all along. Without a time limit priority decides (A, A, B); under
    one, agents take turns: B's first candidate is judged before A's second."""
    gate = threading.Barrier(2, timeout=WAIT_S)

    a = Ranked([together(gate, rms("ta1", fail=True)), rms("ta2", fail=True)], name="A")
    b = ScriptedAgent([together(gate, rms("tb1", fail=True))], name="B")
    run = search(guard, problem, tmp_path, [a, b], budget=3, time_limit_s=time_limit)
    order = "".join(c.agent for c in run.candidates)
    assert order == ("AAB" if time_limit is None else "ABA"), run.describe()


def test_under_a_time_limit_building_on_another_agents_best_goes_first(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """Two proposals ready together, both cheap: B's (priority 0) has the board's best (C's
    incumbent) as its parent, A's (priority 10) its own line. Under a time limit B's goes
    first; with A's parent the best instead, or with B's parent its own incumbent, or with
    no time limit, priority decides again. An expensive proposal (it compiles at run time)
    is deferred behind cheap ones, unless it builds on that best."""
    from concurrent.futures import Future

    from _shared import incumbent_view

    a, b, c = (ScriptedAgent([], name=n) for n in "ABC")
    a.priority = 10  # type: ignore[misc]
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        cfg = run_config(problem, ["A", "B", "C"], time_limit_s=240.0)
        orch = Orchestrator(problem, [a, b, c], cfg, RunDir(tmp_path), store, guard, {})
        orch.state.board.update(incumbent_view("C", "c-best", 3.0, rms("cb")), owner="C")
        orch.state.board.update(incumbent_view("B", "b-own", 2.0, rms("bo")), owner="B")
        assert orch.state.board.best() == ("C", "c-best")

        compiled = rms("xc")
        compiled.sources[0].content += "\n# torch.compile(run) would go here\n"

        def ready(parent: str | None, solution: Solution | None = None) -> Future[Any]:
            fut: Future[Any] = Future()
            sol = solution or rms("x")
            fut.set_result(Proposal(solution=sol, hypothesis="h", parent_id=parent))
            return fut

        def first(a_parent: str | None, b_parent: str | None, b_compiles: bool = False) -> str:
            b_sol = compiled if b_compiles else None
            keys = {
                "A": orch.schedule.judging_order("A", ready(a_parent), 0.0),
                "B": orch.schedule.judging_order("B", ready(b_parent, b_sol), 0.0),
            }
            return min(keys, key=lambda n: keys[n])

        assert first(None, "c-best") == "B"
        assert first(None, "c-best", b_compiles=True) == "B", "on the best: not deferred"
        assert first(None, None, b_compiles=True) == "A", "expensive and not on the best"
        assert first("c-best", None) == "A"
        assert first(None, "b-own") == "A"  # B's own line: priority decides
        orch.state.board.update(incumbent_view("B", "b-own", 4.0, rms("bo")), owner="B")
        assert first(None, "b-own") == "A", "B's own incumbent is the best: not a combination"
        orch.schedule.config = cfg.model_copy(update={"time_limit_s": None})
        orch.state.board.update(incumbent_view("B", "b-own", 1.0, rms("bo")), owner="B")
        assert first(None, "c-best") == "A"  # no time limit: priority
    finally:
        store.close()


class Leading(ScriptedAgent):
    """A scripted agent of class priority 50."""

    priority = 50


class Waiting(ScriptedAgent):
    """A scripted agent asked again only once the board has changed."""

    waits_for_board = True


def on_the_best(context: AgentContext) -> Proposal | None:
    """B's step: nothing while the board has no other agent's best, else, after 0.5 s of
    building, a (failing) proposal with that best as its parent."""
    best = context.board.best() if context.board else None
    if best is None or best.agent == "B":
        return None
    time.sleep(0.5)
    return Proposal(
        solution=rms("ob", fail=True), hypothesis="on the best", parent_id=best.candidate_id
    )


@pytest.mark.parametrize("wait_s", [3.0, 0.0])
def test_after_a_new_best_the_pick_waits_briefly_for_a_proposal_built_on_it(
    guard: Guard, problem: Problem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait_s: float
) -> None:
    """C's solution (priority 50) is judged first and becomes the board's best. A's second
    proposal, of its own line, is ready at once; B's, built on C's best, takes 0.5 s. Under
    a time limit the pick waits for it (up to ``ON_BEST_WAIT_S``), so B's is judged before
    A's; with no wait, A's goes first (``Scheduler.gather_on_best``)."""
    monkeypatch.setattr(schedule, "ON_BEST_WAIT_S", wait_s)
    c = Leading([rms("oc")], name="C")
    a = ScriptedAgent(fails("oa", 3), name="A")
    b = Waiting([on_the_best, on_the_best], name="B")
    run = search(guard, problem, tmp_path, [c, a, b], budget=4, time_limit_s=3600.0)
    order = "".join(x.agent for x in run.candidates)
    assert order[:3] == ("CBA" if wait_s else "CAB"), run.describe()
    b_cand = next(x for x in run.candidates if x.agent == "B")
    assert b_cand.parent_id == run.candidates[0].id, run.describe()


def test_time_is_kept_for_the_composition_once_it_is_possible(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """The reserve is the longest judgement (screening + full stage) among the full passes,
    from the second on, when their per-workload winners would beat the best single one by over twice
    ``min_gain``; the search's time left is the limit's less the reserve."""
    a = ScriptedAgent([], name="A")
    config = run_config(problem, ["A"], time_limit_s=100.0)
    store = SQLiteStore(tmp_path / "store.sqlite")
    uuids = [w.uuid for w in problem.workloads]
    try:
        orch = Orchestrator(problem, [a], config, RunDir(tmp_path), store, guard, {})
        assert orch.clock.reserve() == 0.0
        orch.state.full_s["c1"] = 30.0
        orch.state.full_ms["c1"] = {u: 1.0 + (i % 2) for i, u in enumerate(uuids)}
        assert orch.clock.reserve() == 0.0  # one full pass: nothing to compose yet
        orch.state.full_s["c2"] = 12.0
        orch.state.screen_cost.update({"c1": 5.0, "c2": 30.0})  # reserve: max(30 + 5, 12 + 30)
        orch.state.full_ms["c2"] = {u: 2.0 - (i % 2) for i, u in enumerate(uuids)}  # the other half
        assert orch.clock.reserve() == 42.0
        orch.state.full_ms["c2"] = {u: v * 1.01 for u, v in orch.state.full_ms["c1"].items()}
        assert orch.clock.reserve() == 0.0  # c1 wins everywhere: nothing to compose
        orch.state.full_ms["c2"] = {u: 2.0 - (i % 2) for i, u in enumerate(uuids)}
        assert orch.clock.left_total() - orch.clock.left() == pytest.approx(42.0, abs=0.5)
        off = config.model_copy(update={"compose": False})
        orch2 = Orchestrator(problem, [a], off, RunDir(tmp_path), store, guard, {})
        orch2.state.full_s.update(orch.state.full_s)
        orch2.state.full_ms.update(orch.state.full_ms)
        assert orch2.clock.reserve() == 0.0
    finally:
        store.close()


def test_no_candidate_is_judged_when_its_screening_cannot_fit(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """Under a time limit a proposal whose screening is expected (its parent's, else its
    agent's last) to take over twice the time left is not judged and costs no budget; its
    agent retires saying why. Within that, or with no limit, it is judged."""
    from concurrent.futures import Future

    def proposed(name: str) -> Future[Any]:
        fut: Future[Any] = Future()
        fut.set_result(Proposal(solution=rms(name), hypothesis=name))
        return fut

    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        for limit in (100.0, None):
            config = run_config(problem, ["A"], time_limit_s=limit)
            orch = Orchestrator(
                problem, [ScriptedAgent([], name="A")], config, RunDir(tmp_path), store, guard, {}
            )
            orch.clock.started -= 80.0  # 20 s of a 100 s limit left
            orch.state.agent_cost["A"] = 50.0
            got = orch._record("A", proposed(f"late{limit}"))
            if limit is None:
                assert got is not None and "A" not in orch.state.retired
                continue
            assert got is None and "A" in orch.state.retired
            assert not store.candidates(), "not stored, no budget spent"
            [why] = [e.payload["why"] for e in store.events() if e.kind == "agent_retired"]
            assert "should take ~50 s" in why and "20 s left" in why, why
            orch.state.retired.clear()
            orch.state.agent_cost["A"] = 39.0  # within twice the time left
            assert orch._record("A", proposed("fits")) is not None
    finally:
        store.close()


def test_full_cost_estimate_scales_a_screening_by_the_workloads_only() -> None:
    from kernelarc.orchestration.judge import full_cost_estimate

    # 3 of 16 workloads screened in 30 s: each of the 16 as long as a screened one.
    assert full_cost_estimate(30.0, 16, 3) == pytest.approx(30 * 16 / 3)
    assert full_cost_estimate(30.0, 3, 3) == pytest.approx(30.0)


@pytest.mark.parametrize("screen_s", [1.0, 1000.0])
def test_a_run_warns_once_when_a_full_evaluation_cannot_fit(
    guard: Guard, problem: Problem, tmp_path: Path, screen_s: float
) -> None:
    """After a complete, passed screening the run estimates one full evaluation's cost; when
    it exceeds the time left (here 100 s), one ``full_protocol_too_slow`` event says so."""
    from kernelarc.agents.types import CandidateResult, WorkloadResult

    config = run_config(problem, ["A"], time_limit_s=100.0)
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        orch = Orchestrator(problem, [], config, RunDir(tmp_path), store, guard, {})
        per = tuple(
            WorkloadResult(uuid=w.uuid, axes=dict(w.axes), status="PASSED", latency_ms=1.0)
            for w in orch.judge.screen_set
        )
        screened = CandidateResult(
            candidate_id="c1", agent="A", strategy="s", mode="refine", stage="screen",
            per_workload=per, passed=True, score=1.0,
        )  # fmt: skip
        for _ in range(2):
            orch.schedule.warn_if_full_too_slow(screened, screen_s)
        orch.schedule.warn_if_full_too_slow(
            screened.model_copy(update={"per_workload": per[:1]}), 1e6
        )
        orch.schedule.warn_if_full_too_slow(screened, 1e6, compiles=True)  # compiling, not judging
        kinds = [e.kind for e in store.events()]
        whys = [e.payload["why"] for e in store.events("full_protocol_too_slow")]
    finally:
        store.close()
    assert kinds.count("full_protocol_too_slow") == (1 if screen_s == 1000.0 else 0), kinds
    for why in whys:  # what the user can do: more time, or fewer of the 6 workloads
        assert "of 6 workload(s)" in why and "--time-limit or judge fewer workloads" in why, why


@pytest.mark.parametrize("case", ["fails", "out of time"])
def test_a_finishers_judgement_stops_early(
    guard: Guard, problem: Problem, tmp_path: Path, case: str
) -> None:
    """A finisher's candidate (composition, fallback) stops at its first failing workload,
    and after the first workload once the run's time limit has passed."""
    fail = case == "fails"
    config = run_config(problem, ["A"], time_limit_s=None if fail else 0.001)
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        orch = Orchestrator(problem, [], config, RunDir(tmp_path), store, guard, {})
        solution = rms(f"fin_{fail}", fail=fail)
        _, ev = orch.finisher.final.judge(
            solution, agent=COMPOSER, strategy="s", parent="p", hypothesis=""
        )
    finally:
        store.close()
    assert len(ev.result.per_workload) == 1 and not ev.result.passed, ev.result
    assert ev.result.score is None
    stopped = ev.result.stopped_early or ""
    assert stopped.startswith("RUNTIME_ERROR on workload") if fail else stopped == TIME_LIMIT
