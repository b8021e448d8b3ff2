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

Covered: dedup, conclusions-only memory (contents per round, top-k bound, code refused, off
switch), the board (snapshot per round, frozen, own incumbent, off switch),
plateau-triggered drafting (and its off switch), ablations recorded in the store, resume
after SIGKILL in a real subprocess (before and after a candidate is judged; both cases at
once), one real ``kernelarc optimize`` with the built-in agents (started with the module's
first test, beside the in-process searches). Budget accounting and the judging order are
in test_orchestrator_schedule.py; the composition, the reference fallback and ``kernelarc
status --json`` in test_orchestrator_finish.py; the loop's logic on a fake guard, without
worker processes, in test_loop_fast.py.

Not covered: CUDA, a search cut by its time limit (the judge's part:
test_judge_time_limit.py), Ctrl-C, agents
that raise in ``propose``, agents that never return (test_executor.py), ``--memory``
files across runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead
from data.orchestrator.harness import (
    EXAMPLE,
    RESUME_STEPS,
    SOURCE_LINE,
    CodeClaimAgent,
    Resumed,
    Search,
    after,
    check_status_contract,
    example_guard,
    example_problem,
    fails,
    kernelarc,
    kill_and_resume,
    plateau_steps,
    rms,
    search,
)
from pydantic import ValidationError

from kernelarc.agents.memory import code_marker
from kernelarc.agents.types import AgentContext, BoardSnapshot
from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration.confirm import CONFIRMER, TRIES
from kernelarc.orchestration.finish import COMPOSER, FALLBACK
from kernelarc.problem.loader import Problem
from kernelarc.proposers.scripted import ScriptedAgent

# ---------------------------------------------------------------- fixtures


problem = pytest.fixture(scope="module")(example_problem)
guard = pytest.fixture(scope="module")(example_guard)


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
