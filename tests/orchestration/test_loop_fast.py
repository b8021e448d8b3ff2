"""The orchestrator's logic on a FAKE guard (``fake_guard.py``): no worker process, no
timing, every verdict scripted; each search takes milliseconds.

The real ``Orchestrator``, ``Judge``, store (in memory) and run directory run unchanged;
only the guard and the executor are fakes (proposals are made inline, so the order is the
orchestrator's alone). Covered: ask/tell, promotion and its significance, duplicates, failed
proposals and retirement, waiting for the board, rebasing, plateau drafting, the budget and
the time limit (the fake guard moves the run's clock), the composition decision, the
reference fallback, the confirmation and its runner-up, resume. The same behaviours on the
real guard, with real timing: test_orchestrator.py, test_orchestrator_schedule.py,
test_orchestrator_finish.py, test_confirm.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from data.orchestrator.harness import example_problem, rms, run_config
from orchestration.fake_guard import FakeGuard, InlineExecutor

from kernelarc.agents.base import Agent, Rebasing
from kernelarc.agents.types import AgentContext, Proposal
from kernelarc.orchestration.compose import DISPATCH_FILE
from kernelarc.orchestration.confirm import CONFIRMER
from kernelarc.orchestration.finish import COMPOSER, FALLBACK
from kernelarc.orchestration.judge import TIME_LIMIT
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.loader import Problem
from kernelarc.problem.reference import reference_solution
from kernelarc.problem.schema import Solution, Workload
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.store.memory import MemoryStore

PROBLEM: Problem = example_problem()
UUIDS = [w.uuid for w in PROBLEM.workloads]  # batch sizes 1, 3, 16, 64, 128, 257
SMALL = set(UUIDS[:2])


class Run:
    """An orchestrator on a fake guard and an in-memory store, and what it recorded."""

    def __init__(
        self, tmp_path: Path, agents: Sequence[Agent], guard: FakeGuard, **overrides: Any
    ) -> None:
        self.config = run_config(PROBLEM, [a.name for a in agents], **overrides)
        self.store, self.guard = MemoryStore(), guard
        self.orch = Orchestrator(
            PROBLEM, list(agents), self.config, RunDir(tmp_path), self.store, guard, {},
            executor=InlineExecutor(),
        )  # fmt: skip
        guard.attach(self.orch.clock)
        self.summary: dict[str, Any] = {}

    def run(self) -> Run:
        self.summary = self.orch.run()
        return self

    def kinds(self) -> list[str]:
        return [e.kind for e in self.store.events()]

    def payloads(self, kind: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.store.events(kind)]

    def ids(self, agent: str) -> list[str]:
        return [c.id for c in self.store.candidates() if c.agent == agent]

    def stopped(self) -> str:
        return str(self.payloads("search_stopped")[-1]["reason"])

    def best(self) -> dict[str, Any]:
        return self.payloads("best")[-1]

    def describe(self) -> str:
        return "\n".join(f"{e.kind}: {e.payload}"[:300] for e in self.store.events())


def fake(**kw: Any) -> FakeGuard:
    return FakeGuard(PROBLEM, **kw)


def test_ask_tell_promotes_only_significant_gains(tmp_path: Path) -> None:
    """Each candidate is screened, then judged in full when promising; an incumbent is
    replaced only by a significant gain (``min_gain``); the best full pass is handed over."""
    steps = [rms("a1"), rms("a2"), rms("a3")]
    guard = fake(script={"rms_a1": 0.5, "rms_a2": 0.25, "rms_a3": 0.249})
    run = Run(tmp_path, [ScriptedAgent(steps, name="A")], guard).run()
    info = run.describe()
    a1, a2, a3 = run.ids("A")
    assert [p["candidate"] for p in run.payloads("incumbent")] == [a1, a2], info
    assert [p["improved"] for p in run.payloads("evaluated")] == [True, True, False], info
    # the best full pass by score, significant or not
    assert run.best()["candidate"] == a3 and run.best()["score"] == pytest.approx(4 / 0.996), info
    assert run.stopped() == "every agent is done" and run.orch.state.used == 3, info
    assert guard.judged() == ["rms_a1"] * 2 + ["rms_a2"] * 2 + ["rms_a3"] * 2, info
    assert all(s.closed for s in guard.sessions), "one worker per candidate, closed"
    assert run.summary["evaluated"] == 3 and run.summary["passed"] == 3, run.summary


def test_failures_duplicates_and_errors(tmp_path: Path) -> None:
    """A failing candidate stops at its first workload and is never judged in full; a
    duplicate gets the cached verdict at no cost; an agent whose ``propose`` raises three
    times retires; one with nothing more to try retires."""

    def boom(context: AgentContext) -> Proposal:
        raise RuntimeError("no idea")

    a = ScriptedAgent([rms("bad"), rms("ok"), rms("ok")], name="A")
    b = ScriptedAgent([boom, boom, boom, rms("never")], name="B")
    guard = fake(script={"rms_bad": "RUNTIME_ERROR", "rms_ok": 0.5})
    run = Run(tmp_path, [a, b], guard).run()
    info = run.describe()
    assert guard.calls[0].workloads == [run.orch.judge.screen_set[0].uuid], info
    assert guard.calls[0].stopped and guard.calls[0].stopped.startswith("RUNTIME_ERROR"), info
    assert run.payloads("duplicate") == [{"agent": "A", "of": run.ids("A")[1]}], info
    assert a.results[-1].cached and run.orch.state.used == 2, info
    assert len(run.payloads("propose_error")) == 3, info
    retired = {p["agent"]: p["why"] for p in run.payloads("agent_retired")}
    assert retired == {"B": "errors", "A": "nothing to try"}, info
    assert "RUNTIME_ERROR" in a.contexts[1].feedback, "the failure reaches the agent"


def test_a_budget_stops_the_search(tmp_path: Path) -> None:
    a = ScriptedAgent([rms(f"b{i}") for i in range(5)], name="A")
    run = Run(tmp_path, [a], fake(script={f"rms_b{i}": 0.5 for i in range(5)}), budget=2).run()
    assert run.stopped() == "budget spent" and len(run.ids("A")) == 2, run.describe()


def on_the_best(context: AgentContext) -> Proposal | None:
    """Nothing while the board has no best, else a proposal built on it."""
    best = context.board.best() if context.board else None
    if best is None:
        return None
    return Proposal(solution=rms("on"), hypothesis="on the best", parent_id=best.candidate_id)


class Waiting(ScriptedAgent):
    waits_for_board = True


def test_an_agent_waits_for_the_board_and_builds_on_its_best(tmp_path: Path) -> None:
    a = ScriptedAgent([rms("w1")], name="A")
    b = Waiting([on_the_best, on_the_best], name="B")
    run = Run(tmp_path, [a, b], fake(script={"rms_w1": 0.5, "rms_on": 0.25})).run()
    info = run.describe()
    assert run.payloads("agent_waiting") == [{"agent": "B", "board_version": 0}], info
    [on] = [c for c in run.store.candidates() if c.agent == "B"]
    assert on.parent_id == run.ids("A")[0], info
    assert run.payloads("incumbent")[-1]["agent"] == "B", info


class Rebaser(ScriptedAgent, Rebasing):
    def rebase(self, proposal: Proposal, context: AgentContext) -> Proposal | None:
        assert context.board is not None and context.board.best() is not None
        return Proposal(solution=rms("rebased"), hypothesis="rebased on the board")


def test_a_stale_proposal_is_rebased_on_the_changed_board(tmp_path: Path) -> None:
    """B's candidate, judged first, changes the board; A's proposal, asked before that, is
    replaced by its rebase before it is judged."""
    b = ScriptedAgent([rms("rb")], name="B")
    a = Rebaser([rms("stale")], name="A")
    guard = fake(script={"rms_rb": 0.5, "rms_rebased": 0.25})
    run = Run(tmp_path, [b, a], guard).run()
    info = run.describe()
    assert run.payloads("rebased")[0]["now"] == "rebased on the board", info
    assert "rms_stale" not in guard.judged() and "rms_rebased" in guard.judged(), info


def test_a_plateau_asks_for_a_draft(tmp_path: Path) -> None:
    """After ``patience`` candidates without a gain the agent is asked for a draft."""
    steps = [rms("p0"), rms("p1"), rms("p2"), rms("p3")]
    guard = fake(script={"rms_p0": 0.5, "rms_p1": 0.6, "rms_p2": 0.7, "rms_p3": 0.4})
    a = ScriptedAgent(steps, name="A")
    run = Run(tmp_path, [a], guard, patience=2).run()
    info = run.describe()
    assert run.payloads("draft_requested") == [{"agent": "A"}], info
    assert [c.must_draft for c in a.contexts[:4]] == [False, False, False, True], info
    assert run.payloads("draft")[0]["candidate"] == run.ids("A")[3], info


def test_the_time_limit_cuts_a_judgement_and_retires_an_agent_without_time(
    tmp_path: Path,
) -> None:
    """Each judged workload costs 12 s of a 100 s limit: the first candidate (2 screened, 6
    in full) leaves 4 s; the next, expected to screen for 24 s, is not judged and its agent
    retires. With 10 s per workload the second candidate's screening is cut by the limit."""
    steps = [rms("t1"), rms("t2")]
    guard = fake(script={"rms_t1": 0.5, "rms_t2": 0.4}, seconds_per_workload=12.0)
    run = Run(tmp_path, [ScriptedAgent(steps, name="A")], guard, time_limit_s=100.0).run()
    info = run.describe()
    [why] = [p["why"] for p in run.payloads("agent_retired")]
    assert "should take ~24 s" in why and "4 s left" in why, info
    assert run.stopped() == "every agent is done" and run.orch.state.used == 1, info

    guard = fake(script={"rms_t1": 0.5, "rms_t2": 0.4}, seconds_per_workload=10.0)
    steps = [rms("t1"), rms("t2")]
    run = Run(tmp_path / "cut", [ScriptedAgent(steps, name="A")], guard, time_limit_s=100.0)
    run.run()
    info = run.describe()
    assert run.stopped() == "time limit", info
    assert guard.calls[-1].stopped == TIME_LIMIT, info
    assert [c.solution for c in guard.calls] == ["rms_t1", "rms_t1", "rms_t2"], info


def split(a: float, b: float) -> dict[str, float]:
    """Latencies: ``a`` on the two smallest workloads, ``b`` on the others."""
    return {u: a if u in SMALL else b for u in UUIDS}


def composed_or_reference(ms: dict[str, dict[str, float]], reference: float) -> Any:
    """A fake verdict for the composition (the fastest part on each workload) and the
    reference (``reference`` ms everywhere)."""

    def verdict(solution: Solution, wl: Workload) -> float:
        if any(s.path == DISPATCH_FILE for s in solution.sources):
            return min(lat[wl.uuid] for lat in ms.values())
        assert solution.name.endswith("-reference"), solution.name
        return reference

    return verdict


def test_shape_winners_are_composed_and_kept(tmp_path: Path) -> None:
    ms = {"rms_ca": split(0.5, 1.2), "rms_cb": split(1.2, 0.5)}
    guard = fake(script=dict(ms), verdict=composed_or_reference(ms, 1.0))
    agents = [ScriptedAgent([rms("ca")], name="A"), ScriptedAgent([rms("cb")], name="B")]
    run = Run(tmp_path, agents, guard).run()
    info = run.describe()
    [composition] = run.payloads("composition")
    assert composition["kept"] and composition["parts"] == sorted(run.ids("A") + run.ids("B"))
    assert run.best()["candidate"] == run.ids(COMPOSER)[0], info
    assert run.summary["composed"] == run.ids(COMPOSER), run.summary
    assert run.orch.state.used == 2, "the composition costs no budget"


def test_no_composition_when_one_candidate_wins_everywhere(tmp_path: Path) -> None:
    ms = {"rms_ca": split(0.5, 0.5), "rms_cb": split(0.6, 0.6)}
    guard = fake(script=dict(ms))
    agents = [ScriptedAgent([rms("cb")], name="B"), ScriptedAgent([rms("ca")], name="A")]
    run = Run(tmp_path, agents, guard).run()
    info = run.describe()
    assert "predicted gain 1.000x" in run.payloads("composition_skipped")[0]["why"], info
    assert run.best()["candidate"] == run.ids("A")[0], info


@pytest.mark.parametrize("reference_ms", [1.0, 1.9])
def test_the_reference_replaces_a_slower_solution(tmp_path: Path, reference_ms: float) -> None:
    """The best candidate is slower than the reference (0.5x): the reference is judged in
    full and handed over, whatever it reads of itself (1x, or 0.53x: its noise), since the
    candidate is not significantly faster than the reference."""
    guard = fake(script={"rms_slow": 2.0}, verdict=composed_or_reference({}, reference_ms))
    agents = [ScriptedAgent([rms("slow")], name="A")]
    run = Run(tmp_path, agents, guard, reference_fallback=True).run()
    info = run.describe()
    [fallback] = run.payloads("fallback")
    kept = True
    assert fallback["kept"] is kept and fallback["instead_of"] == run.ids("A")[0], info
    best = run.best()
    assert best["reference"] is kept, info
    assert best["candidate"] == (run.ids(FALLBACK)[0] if kept else run.ids("A")[0]), info
    ref = reference_solution(PROBLEM.definition, agent=FALLBACK, description="")
    assert guard.judged()[-1] == ref.name, info


def test_a_best_that_does_not_reproduce_hands_over_the_runner_up(tmp_path: Path) -> None:
    """The best (a1, 0.5 ms) reads 1.0 ms in a new process: not reproduced; the runner-up
    (b1, 0.8 ms) reproduces and its confirmation is handed over."""
    guard = fake(script={"rms_a1": 0.5, "rms_b1": 0.8}, fresh={"rms_a1": 1.0})
    # B's first: its incumbent makes a1 promising, and both are judged in full
    agents = [ScriptedAgent([rms("b1")], name="B"), ScriptedAgent([rms("a1")], name="A")]
    run = Run(tmp_path, agents, guard, confirm=True).run()
    info = run.describe()
    confirmations = run.payloads("confirmation")
    assert [(c["of"], c["reproduced"]) for c in confirmations] == [
        (run.ids("A")[0], False),
        (run.ids("B")[0], True),
    ], info
    assert run.best()["confirms"] == run.ids("B")[0], info
    assert run.best()["candidate"] == run.ids(CONFIRMER)[1], info
    assert [c.fresh_jit for c in guard.calls[-2:]] == [True, True], info
    lessons = [c for c in run.store.conclusions() if c.agent == CONFIRMER]
    assert [c.outcome for c in lessons] == ["regressed", "no_gain"], info


def test_an_interrupted_search_hands_over_without_composing_or_confirming(
    tmp_path: Path,
) -> None:
    """A stop signal in the search (here: an agent's step raises KeyboardInterrupt in the
    main thread, as a Ctrl-C would) ends it; the run hands over its best, skipping the
    composition and the confirmation, with an event for each."""
    ms = {"rms_ia": split(0.5, 1.2), "rms_ib": split(1.2, 0.5)}

    def ctrl_c(context: AgentContext) -> Proposal:
        raise KeyboardInterrupt

    agents = [ScriptedAgent([rms("ia")], name="A"), ScriptedAgent([rms("ib"), ctrl_c], name="B")]
    run = Run(tmp_path, agents, fake(script=dict(ms)), confirm=True).run()
    info = run.describe()
    assert run.stopped() == "interrupted", info
    assert run.payloads("interrupted")[0]["during"] == "search", info
    assert "interrupted" in run.payloads("compose_skipped")[0]["why"], info
    assert "interrupted" in run.payloads("confirmation_skipped")[0]["why"], info
    assert run.best()["candidate"] in run.ids("A") + run.ids("B"), info


def test_a_resumed_run_counts_what_it_spent_and_judges_what_was_in_flight(
    tmp_path: Path,
) -> None:
    """The second process on the same store continues the agent after its last proposal,
    counts the budget already spent, and judges again a candidate stored without a
    verdict (in flight when the first process died)."""
    from kernelarc.store.base import CandidateRecord

    script = {f"rms_r{i}": 1.0 / (i + 1) for i in range(4)} | {"rms_lost": 0.1}
    guard = fake(script=script)
    steps = [rms(f"r{i}") for i in range(4)]
    first = Run(tmp_path, [ScriptedAgent(steps, name="A")], guard, budget=2).run()
    lost = rms("lost")
    first.store.add_candidate(
        CandidateRecord(id="c0003-A", content_hash=lost.content_hash(), agent="A",
                        strategy="scripted", mode="refine", solution=lost)
    )  # fmt: skip
    again = Run(tmp_path, [ScriptedAgent(steps, name="A")], guard, budget=4)
    again.store = again.orch.store = first.store
    again.orch.events.store = first.store
    again.run()
    info = again.describe()
    [resumed] = again.payloads("resumed")
    assert resumed["used"] == 2 and resumed["redo"] == ["c0003-A"], info
    judged = [p["candidate"] for p in again.payloads("evaluated")]
    assert judged[2:] == ["c0003-A", "c0004-A"], info
    assert again.orch.state.used == 4 and again.stopped() == "budget spent", info
    assert again.payloads("incumbent")[-1]["candidate"] == "c0003-A", info
