"""The multi-agent search engine (``kernelarc.orchestration``) end to end on the CPU.

Every search here is real: a real ``Guard`` (one per module, reused by every in-process
search) judges RMSNorm variants of the bundled example ``rmsnorm_h512``; a real
``SQLiteStore`` and ``RunDir`` keep the run. Only the agents are fakes
(``kernelarc.proposers.scripted.ScriptedAgent``), so that every proposal is known in advance.
Helpers (variants, the search harness, the subprocess script) are in
``tests/data/orchestrator/``.
Variants differ in speed by ``time.sleep`` inside ``run`` on chosen batch sizes (CPU timing
counts it) or fail on purpose (a ``RuntimeError`` on the first workload, which ends the
screening at once and keeps the tests fast).

Covered: budget accounting (total and per agent, no proposal left unjudged), dedup,
conclusions-only memory (contents per round, top-k bound, code refused, off switch), the
board (snapshot per round, frozen, own incumbent, off switch), plateau-triggered drafting
(and its off switch), shape-gated composition kept as the best solution, ablations recorded
in the store, resume after SIGKILL in a real subprocess (before and after a candidate is
judged; both cases at once), ``kernelarc status --json`` and one real ``kernelarc optimize``
with the built-in agents (started with the module's first test, beside the in-process
searches). The tests that finish the composed run again do so on copies of it.

Also: the judging order under a time limit (cheap proposals first), the time kept for the
composition, the reference fallback.

Not covered: CUDA, a search cut by its time limit (the judge's part:
test_judge_time_limit.py), Ctrl-C, agents
that raise in ``propose``, agents that never return (test_executor.py), ``--memory``
files across runs.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead
from data.orchestrator.harness import (
    EXAMPLE,
    GUARD_CONFIG,
    RESUME_STEPS,
    SOURCE_LINE,
    WAIT_S,
    CodeClaimAgent,
    Resumed,
    Search,
    after,
    fails,
    kernelarc,
    kill_and_resume,
    plateau_steps,
    rms,
    run_config,
    search,
)
from pydantic import ValidationError

from kernelarc.agents.base import Rebasing
from kernelarc.agents.memory import code_marker
from kernelarc.agents.types import AgentContext, BoardSnapshot, Proposal
from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration.confirm import CONFIRMER, TRIES
from kernelarc.orchestration.finish import COMPOSER, FALLBACK
from kernelarc.orchestration.judge import TIME_LIMIT
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.orchestration.schedule import judging_order, warn_if_full_too_slow
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.schema import Solution, Trace
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.store.sqlite import SQLiteStore

# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(EXAMPLE)


@pytest.fixture(scope="module")
def guard(problem: Problem) -> Iterator[Guard]:
    with Guard(problem, GUARD_CONFIG) as g:
        yield g


@pytest.fixture(scope="module")
def shared_run(guard: Guard, problem: Problem, tmp_path_factory: pytest.TempPathFactory) -> Search:
    """Three agents with memory and board on: A passes once then fails, B starts only
    after A's first verdict, C's conclusions carry code. A and C have 2 steps each, B 4, the
    budget is 6: B is judged exactly twice, its second context comes after A's verdict."""
    a = ScriptedAgent([rms("sa0"), *fails("sa_f", 1)], name="A", strategy="alpha")
    b = ScriptedAgent([after(a, 1, rms("sb0", fail=True)), *fails("sb_f", 3)], name="B")
    c = CodeClaimAgent(fails("sc_f", 2), name="C", strategy="gamma")
    return search(
        guard, problem, tmp_path_factory.mktemp("shared"), [a, b, c], budget=6, memory_top_k=10
    )


@pytest.fixture(scope="module")
def plateau_run(guard: Guard, problem: Problem, tmp_path_factory: pytest.TempPathFactory) -> Search:
    """Patience 2, drafting and memory (top 2) on, board off."""
    d = ScriptedAgent(plateau_steps("pd"), name="D")
    return search(
        guard,
        problem,
        tmp_path_factory.mktemp("plateau"),
        [d],
        budget=4,
        patience=2,
        board=False,
        memory_top_k=2,
    )


@pytest.fixture(scope="module")
def no_draft_run(
    guard: Guard, problem: Problem, tmp_path_factory: pytest.TempPathFactory
) -> Search:
    """The same script with drafting and memory off, board on."""
    d = ScriptedAgent(plateau_steps("nd"), name="D")
    return search(
        guard,
        problem,
        tmp_path_factory.mktemp("nodraft"),
        [d],
        budget=4,
        patience=2,
        drafting=False,
        memory=False,
    )


@pytest.fixture(scope="module")
def compose_run(guard: Guard, problem: Problem, tmp_path_factory: pytest.TempPathFactory) -> Search:
    """A is slow (100 ms) for batch >= 64, B slow (5 ms) below 64; B is judged first (its
    screening would be hopeless next to A's incumbent)."""
    return search(guard, problem, tmp_path_factory.mktemp("compose"), split_agents("c"), budget=2)


def split_agents(prefix: str) -> list[ScriptedAgent]:
    """Two agents that each win half the shapes: B's candidate is slow (5 ms) below batch
    64, A's (proposed after B's is judged) slow (100 ms) from 64 on."""
    b = ScriptedAgent([rms(f"{prefix}b", slow="b < 64", sleep_s=0.005)], name="B", strategy="beta")
    a = ScriptedAgent(
        [after(b, 1, rms(f"{prefix}a", slow="b >= 64", sleep_s=0.1))], name="A", strategy="alpha"
    )
    return [a, b]


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
        orch.board.update(incumbent_view("C", "c-best", 3.0, rms("cb")), owner="C")
        orch.board.update(incumbent_view("B", "b-own", 2.0, rms("bo")), owner="B")
        assert orch.board.best() == ("C", "c-best")

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
                "A": judging_order(orch, "A", ready(a_parent), 0.0),
                "B": judging_order(orch, "B", ready(b_parent, b_sol), 0.0),
            }
            return min(keys, key=lambda n: keys[n])

        assert first(None, "c-best") == "B"
        assert first(None, "c-best", b_compiles=True) == "B", "on the best: not deferred"
        assert first(None, None, b_compiles=True) == "A", "expensive and not on the best"
        assert first("c-best", None) == "A"
        assert first(None, "b-own") == "A"  # B's own line: priority decides
        orch.board.update(incumbent_view("B", "b-own", 4.0, rms("bo")), owner="B")
        assert first(None, "b-own") == "A", "B's own incumbent is the best: not a combination"
        orch.config = cfg.model_copy(update={"time_limit_s": None})
        orch.board.update(incumbent_view("B", "b-own", 1.0, rms("bo")), owner="B")
        assert first(None, "c-best") == "A"  # no time limit: priority
    finally:
        store.close()


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
        assert orch.reserve() == 0.0
        orch.full_s["c1"] = 30.0
        orch.full_ms["c1"] = {u: 1.0 + (i % 2) for i, u in enumerate(uuids)}
        assert orch.reserve() == 0.0  # one full pass: nothing to compose yet
        orch.full_s["c2"] = 12.0
        orch.screen_cost.update({"c1": 5.0, "c2": 30.0})  # reserve: max(30 + 5, 12 + 30)
        orch.full_ms["c2"] = {u: 2.0 - (i % 2) for i, u in enumerate(uuids)}  # the other half
        assert orch.reserve() == 42.0
        orch.full_ms["c2"] = {u: v * 1.01 for u, v in orch.full_ms["c1"].items()}
        assert orch.reserve() == 0.0  # c1 wins everywhere: nothing to compose
        orch.full_ms["c2"] = {u: 2.0 - (i % 2) for i, u in enumerate(uuids)}
        assert orch.time_left_total() - orch.time_left() == pytest.approx(42.0, abs=0.5)
        off = config.model_copy(update={"compose": False})
        orch2 = Orchestrator(problem, [a], off, RunDir(tmp_path), store, guard, {})
        orch2.full_s.update(orch.full_s)
        orch2.full_ms.update(orch.full_ms)
        assert orch2.reserve() == 0.0
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
            orch.started -= 80.0  # 20 s of a 100 s limit left
            orch.agent_cost["A"] = 50.0
            got = orch._record("A", proposed(f"late{limit}"))
            if limit is None:
                assert got is not None and "A" not in orch.retired
                continue
            assert got is None and "A" in orch.retired
            assert not store.candidates(), "not stored, no budget spent"
            [why] = [e.payload["why"] for e in store.events() if e.kind == "agent_retired"]
            assert "should take ~50 s" in why and "20 s left" in why, why
            orch.retired.clear()
            orch.agent_cost["A"] = 39.0  # within twice the time left
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
            warn_if_full_too_slow(orch, screened, screen_s)
        warn_if_full_too_slow(orch, screened.model_copy(update={"per_workload": per[:1]}), 1e6)
        warn_if_full_too_slow(orch, screened, 1e6, compiles=True)  # compiling, not judging
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
    from kernelarc.orchestration.finish import judge_final

    fail = case == "fails"
    config = run_config(problem, ["A"], time_limit_s=None if fail else 0.001)
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        orch = Orchestrator(problem, [], config, RunDir(tmp_path), store, guard, {})
        solution = rms(f"fin_{fail}", fail=fail)
        _, ev = judge_final(orch, solution, agent=COMPOSER, strategy="s", parent="p", hypothesis="")
    finally:
        store.close()
    assert len(ev.result.per_workload) == 1 and not ev.result.passed, ev.result
    assert ev.result.score is None
    stopped = ev.result.stopped_early or ""
    assert stopped.startswith("RUNTIME_ERROR on workload") if fail else stopped == TIME_LIMIT


# ---------------------------------------------------------------- 2. dedup


def test_duplicate_is_not_judged_and_costs_no_budget(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    s, t = rms("dup_s", fail=True), rms("dup_t", fail=True)
    a = ScriptedAgent([s, s, t], name="A")
    run = search(guard, problem, tmp_path, [a], budget=2)
    info = run.describe()
    assert [c.solution.name for c in run.candidates] == ["rms_dup_s", "rms_dup_t"], info
    first = run.candidates[0].id
    assert run.payloads("duplicate") == [{"agent": "A", "of": first}], info
    assert run.judged() == [c.id for c in run.candidates], info
    # Judged once: one screening record (the failure ends it), none for the duplicate.
    assert [e.candidate_id for e in run.evaluations] == [first, run.candidates[1].id], info
    assert run.summary["evaluated"] == 2, info
    assert run.payloads("search_stopped")[-1]["reason"] == "budget spent", info
    assert [r.cached for r in a.results] == [False, True, False], info
    assert a.results[1].candidate_id == first and not a.results[1].improved, info
    assert a.results[1].per_workload == a.results[0].per_workload, info
    # The duplicate's budget_left shows it cost nothing; it stores no conclusion.
    assert [c.budget_left for c in a.contexts] == [2, 1, 1], info
    assert [c.candidate_id for c in run.conclusions] == [first, run.candidates[1].id], info


# ---------------------------------------------------------------- 3. memory


def test_memory_holds_conclusions_of_other_agents_never_code(shared_run: Search) -> None:
    run = shared_run
    info = run.describe()
    judged = run.judged()
    assert len(judged) == 6, info
    # One conclusion stored per judged candidate, code or not.
    assert sorted(c.candidate_id for c in run.conclusions) == sorted(judged), info
    rejected = [c for c in run.conclusions if c.agent == "C"]
    assert len(run.payloads("conclusion_rejected")) == len(rejected) >= 1, info
    shareable = {c.candidate_id for c in run.conclusions if c.agent != "C"}
    first_a = run.ids("A")[0]
    assert judged.index(first_a) < judged.index(run.ids("B")[0]), info
    seen_a_in_b = False
    for name, agent in run.agents.items():
        for ctx in agent.contexts:
            got = [c.candidate_id for c in ctx.conclusions]
            want = {cid for cid in judged[: ctx.round] if cid in shareable}
            assert len(got) == len(set(got)) and set(got) == want, (name, ctx.round, got, info)
            for c in ctx.conclusions:
                assert code_marker(c.claim) is None and SOURCE_LINE not in c.claim, c
            seen_a_in_b |= name == "B" and first_a in got
    assert seen_a_in_b, info
    # B's first context came before anything was judged; its second after A's verdict.
    assert run.agents["B"].contexts[0].conclusions == (), info


def test_memory_top_k_bounds_each_context(plateau_run: Search) -> None:
    ctxs = plateau_run.agents["D"].contexts
    assert [c.round for c in ctxs] == [0, 1, 2, 3], plateau_run.describe()
    assert [len(c.conclusions) for c in ctxs] == [0, 1, 2, 2], plateau_run.describe()
    judged = plateau_run.judged()
    for ctx in ctxs:
        assert {c.candidate_id for c in ctx.conclusions} <= set(judged[: ctx.round])


def test_memory_off_shows_no_conclusions(no_draft_run: Search) -> None:
    run = no_draft_run
    ctxs = run.agents["D"].contexts
    assert len(ctxs) == 4 and all(c.conclusions == () for c in ctxs), run.describe()
    # Conclusions are still written to the store, one per judged candidate.
    assert [c.candidate_id for c in run.conclusions] == run.judged(), run.describe()


# ---------------------------------------------------------------- 4. board


def test_board_is_a_frozen_snapshot_of_incumbents(shared_run: Search) -> None:
    run = shared_run
    info = run.describe()
    first_a = run.ids("A")[0]
    assert run.payloads("incumbent") == [
        {"agent": "A", "candidate": first_a, "score": run.payloads("incumbent")[0]["score"]}
    ], info
    seen_in_b: AgentContext | None = None
    for name, agent in run.agents.items():
        for ctx in agent.contexts:
            assert isinstance(ctx.board, BoardSnapshot), (name, ctx.round)
            want = run.incumbents_after(ctx.round)
            got = {i.agent: i.candidate_id for i in ctx.board.incumbents}
            assert got == want, (name, ctx.round, got, want, info)
            own = ctx.incumbent.candidate_id if ctx.incumbent else None
            assert own == want.get(name), (name, ctx.round, own, info)
            if name == "A" and own is not None:
                assert len(ctx.incumbent_results) == 6, ctx.incumbent_results
                assert all(r.status == "PASSED" for r in ctx.incumbent_results)
            if name == "B" and got:
                seen_in_b = ctx
    assert seen_in_b is not None and seen_in_b.board is not None, info
    board = seen_in_b.board
    view = board.incumbents[0]
    assert view.agent == "A" and view.solution.name == "rms_sa0" and view.score > 0
    with pytest.raises(ValidationError):
        board.version = 99  # type: ignore[misc]
    with pytest.raises(ValidationError):
        view.score = 1e9  # type: ignore[misc]
    with pytest.raises(ValidationError):
        seen_in_b.board = None  # type: ignore[misc]
    # A snapshot is a copy: changing what a container inside it holds changes no other one.
    view.latencies_ms.clear()
    later = [c.board for c in run.agents["A"].contexts if c.board and c.board.incumbents]
    assert later and all(len(b.incumbents[0].latencies_ms) == 6 for b in later)


def test_board_off_gives_none_but_own_incumbent(plateau_run: Search) -> None:
    run = plateau_run
    ctxs = run.agents["D"].contexts
    first = run.ids("D")[0]
    assert all(c.board is None for c in ctxs), run.describe()
    assert [c.incumbent.candidate_id if c.incumbent else None for c in ctxs] == [
        None,
        first,
        first,
        first,
    ], run.describe()


# ---------------------------------------------------------------- 5. plateau -> draft


def test_plateau_triggers_a_draft(plateau_run: Search) -> None:
    run = plateau_run
    info = run.describe()
    ids = run.ids("D")
    assert len(ids) == 4, info
    assert [p["improved"] for p in run.payloads("evaluated")] == [True, False, False, False], info
    assert [c.must_draft for c in run.agents["D"].contexts] == [False, False, False, True], info
    assert run.payloads("draft_requested") == [{"agent": "D"}], info
    assert [c.mode for c in run.candidates] == ["refine", "refine", "refine", "draft"], info
    assert run.payloads("draft") == [{"agent": "D", "candidate": ids[3], "parent": None}], info
    assert [r.mode for r in run.agents["D"].results] == ["refine", "refine", "refine", "draft"]
    # The draft was requested after the 3rd verdict (2 without gain) and before the 4th.
    kinds = [e.kind for e in run.events if e.kind in ("evaluated", "draft_requested", "draft")]
    assert kinds == ["evaluated"] * 3 + ["draft_requested", "draft", "evaluated"], info


def test_drafting_off_never_asks_for_a_draft(no_draft_run: Search) -> None:
    run = no_draft_run
    info = run.describe()
    assert [c.must_draft for c in run.agents["D"].contexts] == [False] * 4, info
    assert run.payloads("draft_requested") == [] and run.payloads("draft") == [], info
    assert [c.mode for c in run.candidates] == ["refine"] * 4, info
    assert [p["improved"] for p in run.payloads("evaluated")] == [True, False, False, False], info
    # The board is on in this run: the agent sees its own incumbent there.
    boards = [c.board for c in run.agents["D"].contexts]
    assert [len(b.incumbents) if b else None for b in boards] == [0, 1, 1, 1], info


# ---------------------------------------------------------------- 6. composition


def test_composition_of_shape_winners_is_kept_as_best(compose_run: Search) -> None:
    run = compose_run
    info = run.describe()
    b_id, a_id = run.ids("B")[0], run.ids("A")[0]
    assert run.judged() == [b_id, a_id], info
    full = {e.candidate_id: e.result for e in run.evaluations if e.stage == "full"}
    assert set(full) == {a_id, b_id, f"c0003-{COMPOSER}"}, info
    # The sleeps made A win below batch 64 and B from 64 on.
    lat = {cid: {r.axes["batch_size"]: r.latency_ms or 0.0 for r in full[cid].per_workload}
           for cid in (a_id, b_id)}  # fmt: skip
    for bs in (1, 3, 16):
        assert lat[a_id][bs] < lat[b_id][bs], (bs, lat)
    for bs in (64, 128, 257):
        assert lat[b_id][bs] < lat[a_id][bs], (bs, lat)
    composer = run.candidates[-1]
    assert composer.agent == COMPOSER and composer.id == f"c0003-{COMPOSER}", info
    single = max((a_id, b_id), key=lambda cid: full[cid].score or 0.0)
    assert composer.parent_id == single, info  # the composition's default: the best single
    assert run.payloads("composition") == [
        {
            "candidate": composer.id,
            "passed": True,
            "score": full[composer.id].score,
            "stopped": None,
            "kept": True,
            "parts": sorted([a_id, b_id]),
        }
    ], info
    assert run.payloads("best")[-1]["candidate"] == composer.id, info
    assert run.summary["best"]["is_reference"] is False, info
    best = load_solution(run.run_dir / "best" / "solution.json")
    assert best.spec.entry_point == "dispatch.py::run", best.spec
    assert best.content_hash() == composer.solution.content_hash()
    lines = (run.run_dir / "best" / "traces.jsonl").read_text().splitlines()
    traces = [Trace.model_validate_json(line) for line in lines]
    assert len(traces) == 6
    assert all(t.evaluation and t.evaluation.status.value == "PASSED" for t in traces)
    summary = run.summary
    assert summary["best"]["all_passed"] is True, summary
    assert summary["best"]["candidate_id"] == composer.id, summary
    assert summary["best"]["speedup"] == pytest.approx(full[composer.id].score), summary
    assert (full[composer.id].score or 0) > (full[single].score or 0), info


def test_reference_fallback_replaces_a_candidate_slower_than_eager(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """The only candidate sleeps 20 ms per call: slower than the eager reference on every
    workload. With the fallback on, the reference is judged in full at the end and handed
    back instead; it costs no budget."""
    a = ScriptedAgent([rms("fb", slow="True", sleep_s=0.02)], name="A")
    run = search(guard, problem, tmp_path, [a], budget=1, reference_fallback=True)
    info = run.describe()
    [slow] = run.ids("A")
    [fallback] = run.payloads("fallback")
    ref = run.candidates[-1]
    assert ref.agent == FALLBACK and ref.parent_id == slow, info
    assert fallback == {
        "candidate": ref.id,
        "passed": True,
        "score": fallback["score"],
        "stopped": None,
        "instead_of": slow,
        "kept": True,
    }, info
    full = {e.candidate_id: e.result for e in run.evaluations if e.stage == "full"}
    assert (full[slow].score or 1.0) < 1.0, info
    assert (full[slow].score or 1.0) < (full[ref.id].score or 0.0), info
    assert run.payloads("best")[-1]["candidate"] == ref.id, info
    assert run.summary["best"]["is_reference"] is True, "the summary says the best is the reference"
    best = load_solution(run.run_dir / "best" / "solution.json")
    assert best.sources[0].content == problem.definition.reference
    assert run.summary["evaluated"] == 1 and run.summary["best"]["candidate_id"] == ref.id
    assert run.summary["fallback"] == [ref.id] and run.summary["composed"] == []


def test_no_fallback_when_the_chosen_solution_is_the_reference(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """Whatever it measures, the reference is not judged again to replace itself. (Without
    the check this fails only when the reference, judged as a candidate, reads below 1x
    over eager, the common case on a CPU; at or above 1x no fallback is tried anyway.)"""
    from kernelarc.problem.reference import reference_solution

    ref = reference_solution(problem.definition, agent="A", description="as a candidate")
    a = ScriptedAgent([ref], name="A")
    run = search(guard, problem, tmp_path, [a], budget=1, reference_fallback=True)
    info = run.describe()
    assert run.payloads("fallback") == [] and run.payloads("fallback_skipped") == [], info
    assert run.payloads("best")[-1]["candidate"] == run.ids("A")[0], info


def resumable_copy(run: Search, tmp_path: Path) -> Path:
    """A copy of ``run``'s finished run directory (its store and files) to resume or finish
    again, leaving the module's run as the other tests read it."""
    copy = tmp_path / "run"
    shutil.copytree(run.run_dir, copy)
    return copy


def test_a_resumed_finish_composes_the_agents_candidates_afresh(
    guard: Guard, problem: Problem, compose_run: Search, tmp_path: Path
) -> None:
    """Finishing again (a resumed run whose budget is spent) composes the agents' full
    passes, never the earlier composition."""

    first = compose_run
    [composed] = first.payloads("composition")
    run_dir = resumable_copy(first, tmp_path)
    again = search(guard, problem, run_dir, split_agents("c"), budget=2)
    info = again.describe()
    compositions = again.payloads("composition")
    assert len(compositions) == 2, info
    assert compositions[1]["parts"] == composed["parts"] == sorted(first.ids("A") + first.ids("B"))


def test_no_composition_starts_with_less_time_left_than_its_parts_took(
    guard: Guard, problem: Problem, compose_run: Search, tmp_path: Path
) -> None:
    """Under a time limit the composition is skipped, with an event saying why, when less
    time is left than the longest judgement of its parts (it would overrun the limit and be
    cut); with enough left it is judged."""
    from kernelarc.orchestration.finish import finish

    first = compose_run
    assert len(first.payloads("composition")) == 1, first.describe()
    a_id, b_id = first.ids("A")[0], first.ids("B")[0]
    run_dir = resumable_copy(first, tmp_path)
    config = run_config(problem, ["A", "B"], budget=2, time_limit_s=100.0)
    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        orch = Orchestrator(problem, split_agents("c"), config, RunDir(run_dir), store, guard, {})
        orch.started -= 80.0  # 20 s of the 100 s left
        orch.full_s.update({a_id: 50.0, b_id: 1.0})
        finish(orch)
        skipped = [e.payload for e in store.events() if e.kind == "composition_skipped"]
        assert len(skipped) == 1 and "s left, under the 50 s its parts took" in skipped[0]["why"]
        assert len([e for e in store.events() if e.kind == "composition"]) == 1, "none new"
        orch.full_s.update({a_id: 5.0})
        finish(orch)
        assert len([e for e in store.events() if e.kind == "composition"]) == 2
    finally:
        store.close()


def test_each_stage_says_where_its_time_went(compose_run: Search) -> None:
    """The evaluated events carry each stage's phases (the guard's own accounting; a worker
    started ahead, as the warm spare is, counts its start though it overlapped earlier work)."""
    for payload in compose_run.payloads("evaluated"):
        for name, stage in payload["stages"].items():
            phases = stage["phases_s"]
            assert {"correctness", "timing", "recheck"} <= set(phases), (name, phases)
            assert all(v >= 0 for v in phases.values()), (name, phases)
            assert phases["correctness"] + phases["timing"] <= stage["wall_s"] + 0.05


def test_status_evaluated_counts_only_budgeted_candidates(compose_run: Search) -> None:
    assert compose_run.summary["evaluated"] == compose_run.summary["budget"] == 2


# ---------------------------------------------------------------- 7. ablations recorded


def test_independent_is_recorded_and_shares_nothing(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    a = ScriptedAgent([rms("ind0"), *fails("ind_f", 2)], name="A")
    run = search(guard, problem, tmp_path, [a], budget=3, independent=True)
    info = run.describe()
    [stored] = run.payloads("run_config")
    assert (stored["independent"], stored["memory"], stored["board"], stored["drafting"]) == (
        True,
        False,
        False,
        False,
    ), stored
    assert json.loads((tmp_path / "config.json").read_text()) == stored
    assert [c.round for c in a.contexts] == [0, 1, 2], info
    assert all(c.board is None and c.conclusions == () for c in a.contexts), info
    assert len(run.conclusions) == 3, info


def test_single_ablations_are_recorded(plateau_run: Search, no_draft_run: Search) -> None:
    [p] = plateau_run.payloads("run_config")
    [n] = no_draft_run.payloads("run_config")
    flags = ("memory", "board", "drafting", "independent", "patience", "budget")
    assert [p[k] for k in flags] == [True, False, True, False, 2, 4], p
    assert [n[k] for k in flags] == [False, True, False, False, 2, 4], n


def test_resume_after_a_refused_conclusion(guard: Guard, problem: Problem, tmp_path: Path) -> None:
    steps = fails("rc_f", 2)
    # The same configuration twice; the first run has one step only, so it ends early.
    first = search(guard, problem, tmp_path, [CodeClaimAgent(steps[:1], name="C")], budget=2)
    assert len(first.payloads("conclusion_rejected")) == 1, first.describe()
    assert first.payloads("search_stopped")[-1]["reason"] == "every agent is done"
    again = search(guard, problem, tmp_path, [CodeClaimAgent(steps, name="C")], budget=2)
    assert [c.solution.name for c in again.candidates] == ["rms_rc_f0", "rms_rc_f1"]
    assert again.summary["evaluated"] == 2, again.describe()


def test_resume_rebuilds_the_boards_former_incumbents(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """An agent's replaced incumbent is still on the board after a resume: rebuilt from the
    store's ``incumbent`` events, candidates and evaluations. Two real runs of one
    configuration in one run directory (its SQLite file); the first has two steps only, so
    it ends early, and the second resumes it and asks for the third."""
    steps = [rms("fi_slow", slow="True", sleep_s=0.005), rms("fi_fast"), *fails("fi_f", 1)]
    first = search(guard, problem, tmp_path, [ScriptedAgent(steps[:2], name="A")], budget=3)
    promoted = [p["candidate"] for p in first.payloads("incumbent")]
    assert len(promoted) == 2, first.describe()
    agent = ScriptedAgent(steps, name="A")
    again = search(guard, problem, tmp_path, [agent], budget=3)
    assert again.payloads("resumed"), again.describe()
    assert [c.solution.name for c in again.candidates][-1] == "rms_fi_f0", again.describe()
    snap = agent.contexts[-1].board
    assert snap is not None, again.describe()
    assert [v.candidate_id for v in snap.incumbents] == promoted[1:], again.describe()
    assert [v.candidate_id for v in snap.former] == promoted[:1], again.describe()
    [replaced] = [c for c in first.candidates if c.id == promoted[0]]
    assert snap.former[0].solution == replaced.solution
    assert snap.former[0].score > 0 and len(snap.former[0].latencies_ms) == len(problem.workloads)


# ---------------------------------------------------------------- 8. resume after SIGKILL


@pytest.fixture(scope="module")
def resumed_runs(problem: Problem, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Resumed]:
    """Both cases at once, each in its own processes, run directory and guard: what they
    check depends on no timing but A's first candidate being its fastest (by 5 ms a call)."""
    kills = {
        "before-judging": ("kill-draft", {"event": "draft", "nth": 1}),
        "after-judging": ("kill-evaluated", {"event": "evaluated", "nth": 2}),
    }
    with ThreadPoolExecutor(max_workers=len(kills)) as pool:
        futures = {
            case: pool.submit(kill_and_resume, tmp_path_factory.mktemp(name), problem, kill)
            for case, (name, kill) in kills.items()
        }
        return {case: fut.result() for case, fut in futures.items()}


def check_resumed(r: Resumed) -> None:
    run = r.search
    info = run.describe()
    ids = [c.id for c in run.candidates]
    assert len(ids) == len(set(ids)), info
    assert run.payloads("run_config")[0] == run.payloads("run_config")[-1], info
    # Every candidate judged exactly once, the budget spent exactly.
    judged = run.judged()
    assert sorted(judged) == sorted(ids) and len(judged) == len(set(judged)), info
    assert [e.candidate_id for e in run.evaluations if e.stage == "screen"] == judged, info
    assert len(judged) == run.config.budget == 6, info
    assert run.summary["evaluated"] == 6 and run.payloads("search_stopped")[-1]["used"] == 6
    assert ids[: len(r.before_kill)] == r.before_kill, info
    assert (run.run_dir / "best" / "solution.json").is_file(), info
    [first] = [c.id for c in run.candidates if c.solution.name == "rms_ra0"]
    assert run.summary["best"]["candidate_id"] == first, info  # the only one that passes


def test_resume_after_kill_before_judging(resumed_runs: dict[str, Resumed]) -> None:
    r = resumed_runs["before-judging"]
    run = r.search
    info = run.describe()
    check_resumed(r)
    in_flight = run.payloads("draft")[0]["candidate"]
    assert r.before_kill[-1] == in_flight, info
    assert run.payloads("resumed") == [
        {"used": len(r.before_kill) - 1, "redo": [in_flight], "told": []}
    ], info
    # Judged after the resume, before any new proposal.
    kinds = [(e.kind, e.payload.get("candidate")) for e in run.events]
    at = kinds.index(("resumed", None))
    assert kinds[at + 1] == ("evaluated", in_flight), info


def test_resume_after_kill_after_judging(resumed_runs: dict[str, Resumed]) -> None:
    r = resumed_runs["after-judging"]
    run = r.search
    check_resumed(r)
    [resumed] = run.payloads("resumed")
    # Killed at the 2nd "evaluated" event: judged, but its agent was never told.
    assert resumed["used"] == 2 and resumed["redo"] == [], run.describe()
    assert resumed["told"] == [r.before_kill[-1]], run.describe()
    assert len(r.before_kill) == 2, run.describe()


@pytest.mark.parametrize(
    "case",
    [
        "before-judging",
        "after-judging",
    ],
)
def test_resumed_agents_continue_with_their_next_step(
    resumed_runs: dict[str, Resumed], case: str
) -> None:
    r = resumed_runs[case]
    run = r.search
    recorded = {c.solution.name for c in run.candidates if c.id in r.before_kill}
    again = [p for p in r.proposals if p["pid"] != r.first_pid and p["solution"] in recorded]
    assert again == [], (again, run.describe())
    assert run.payloads("duplicate") == [], run.describe()
    for name, steps in RESUME_STEPS.items():
        proposed = [p["solution"] for p in r.proposals if p["agent"] == name and p["solution"]]
        order = [s.name for s in steps]
        # In order, each step at most twice (a proposal in flight at the kill is asked again).
        assert [n for i, n in enumerate(proposed) if n not in proposed[:i]] == order[
            : len(set(proposed))
        ], (name, proposed)


@pytest.mark.parametrize(
    "case",
    [
        "before-judging",
        "after-judging",
    ],
)
def test_resume_keeps_one_conclusion_per_judged_candidate(
    resumed_runs: dict[str, Resumed], case: str
) -> None:
    run = resumed_runs[case].search
    assert sorted(c.candidate_id for c in run.conclusions) == sorted(run.judged()), run.describe()


# ---------------------------------------------------------------- 9-10. the CLI


STATUS_KEYS = {"budget", "evaluated", "passed", "agents", "conclusions", "candidate_ids", "best"}


def check_status_contract(status: dict[str, Any], run_dir: Path) -> None:
    assert STATUS_KEYS <= set(status), status
    for key in ("budget", "evaluated", "passed", "conclusions"):
        assert isinstance(status[key], int), (key, status)
    assert isinstance(status["candidate_ids"], list), status
    for a in status["agents"]:
        assert {"name", "strategy", "candidates", "conclusions", "incumbent"} <= set(a), a
    best = status["best"]
    assert {"path", "all_passed", "speedup"} <= set(best), best
    assert Path(best["path"]) == run_dir / "best" / "solution.json", best


def test_status_json_prints_the_contract(compose_run: Search, tmp_path: Path) -> None:
    run = compose_run
    p = kernelarc(["status", str(run.run_dir), "--json"], tmp_path, 120)
    assert p.returncode == 0, p.stderr
    status = json.loads(p.stdout)
    check_status_contract(status, run.run_dir)
    assert status == run.summary
    assert status == json.loads((run.run_dir / "summary.json").read_text())
    assert status["budget"] == 2 and status["conclusions"] == 2, status
    assert status["candidate_ids"] == [c.id for c in run.candidates], status
    by_name = {a["name"]: a for a in status["agents"]}
    assert list(by_name) == ["A", "B"], status
    for name, strategy in (("A", "alpha"), ("B", "beta")):
        [cid] = run.ids(name)
        assert by_name[name]["strategy"] == strategy
        assert by_name[name]["candidates"] == by_name[name]["conclusions"] == 1
        assert by_name[name]["incumbent"]["candidate_id"] == cid, status
    assert status["best"]["all_passed"] is True, status


def _optimize_with_builtin_agents(tmp_path: Path) -> tuple[Any, Any, Path]:
    """``kernelarc optimize`` with the reference and compiler agents (budget 3), then
    ``kernelarc status --json`` of its run (None if it failed); the run directory."""
    run_dir = tmp_path / "run"
    args = ["optimize", str(EXAMPLE), "--agents", "reference,compiler", "--budget", "3"]
    args += ["--device", "cpu", "--full-iterations", "5", "--full-warmup", "1"]
    p = kernelarc([*args, "--run-dir", str(run_dir)], tmp_path, 400)
    s = kernelarc(["status", str(run_dir), "--json"], tmp_path, 120) if p.returncode == 0 else None
    return p, s, run_dir


@pytest.fixture(scope="module", autouse=True)
def cli_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """The real ``kernelarc optimize`` (its own processes, guard and run directory), started
    with this module's first test (``_shared``'s ``started_ahead``) while the in-process
    searches run: what its test checks is no timing (either agent may win)."""
    name = "test_optimize_cli_with_builtin_agents"
    jobs = {name: partial(_optimize_with_builtin_agents, tmp_path_factory.mktemp("cli"))}
    yield from started_ahead(request, jobs)


@pytest.mark.slow
def test_optimize_cli_with_builtin_agents(cli_run: dict[str, Future[Any]]) -> None:
    p, s, run_dir = cli_run["test_optimize_cli_with_builtin_agents"].result()
    assert p.returncode == 0, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-5000:]}"
    assert s.returncode == 0, s.stderr
    status = json.loads(s.stdout)
    check_status_contract(status, run_dir)
    composed = [c for c in status["candidate_ids"] if c.endswith(f"-{COMPOSER}")]
    fallback = [c for c in status["candidate_ids"] if c.endswith(f"-{FALLBACK}")]
    assert status["evaluated"] == 3, status
    assert status["composed"] == composed, status
    assert status["fallback"] == fallback, status
    # Finishers cost no budget: whether the compiler's candidate wins on a noisy CPU (and so
    # is confirmed in a new process) or the reference's does (not confirmed) varies by run.
    confirmed = [c for c in status["candidate_ids"] if c.endswith(f"-{CONFIRMER}")]
    assert status["confirmations"] == confirmed and len(confirmed) <= TRIES, status
    finishers = len(composed) + len(fallback) + len(confirmed)
    assert len(status["candidate_ids"]) - finishers == 3, status
    assert [a["name"] for a in status["agents"]] == ["reference", "compiler"], status
    assert sum(a["candidates"] for a in status["agents"]) == 3, status
    assert status["best"]["all_passed"] is True, status
    assert (run_dir / "traces.jsonl").is_file() and (run_dir / "events.jsonl").is_file()
