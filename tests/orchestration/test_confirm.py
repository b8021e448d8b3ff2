"""The confirmation of a run's chosen solution in a new process with empty JIT caches
(``orchestration/confirm.py``), and the guard's ``fresh_jit`` worker it stands on.

The draw-dependent candidate here is a FAKE of Inductor's cached autotuning pick (which
cannot be reproduced on demand on a CPU): it is fast only when a file it looks for exists in
its ``TORCHINDUCTOR_CACHE_DIR``, which the test plants in the guard's shared cache.
Measurements of the real thing on GPUs are in docs/PERFORMANCE.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from data.orchestrator.harness import (
    EXAMPLE,
    GUARD_CONFIG,
    after,
    rms,
    rms_solution,
    run_config,
    search,
)

from kernelarc.agents.types import CandidateResult, WorkloadResult
from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration.confirm import CONFIRMER, draws_at_run_time, reproduced, slowdown
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.schema import Solution
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.store.base import EvaluationRecord

PICK = "ka-test-autotune-pick"

PICK_SOURCE = f'''"""FAKE of a cached autotuning pick: fast only when its pick is cached."""

import os
import time

import torch

_FAST = os.path.exists(os.path.join(os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""), "{PICK}"))


@torch.no_grad()
def run(hidden_states, weight, output):
    if not _FAST:
        time.sleep(0.04)
    x = hidden_states.to(torch.float32)
    inv = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-6)
    output.copy_(x * inv * weight.to(torch.float32))
'''


def pick_solution() -> Solution:
    return rms_solution("cached_pick", PICK_SOURCE)


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(EXAMPLE)


@pytest.fixture(scope="module")
def guard(problem: Problem, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guard]:
    """A guard whose shared cache holds the pick (its own cache, not the user's)."""
    cache = tmp_path_factory.mktemp("cache")
    (cache / "inductor").mkdir()
    (cache / "inductor" / PICK).write_text("the pick")
    with Guard(problem, GUARD_CONFIG.model_copy(update={"cache_dir": cache})) as g:
        yield g


def _ev(lat: dict[str, float], passed: bool = True) -> EvaluationRecord:
    per = tuple(
        WorkloadResult(uuid=u, axes={}, status="PASSED", latency_ms=ms, reference_ms=1.0)
        for u, ms in lat.items()
    )
    result = CandidateResult(
        candidate_id="c1",
        agent="a",
        strategy="s",
        mode="draft",
        stage="full",
        per_workload=per,
        passed=passed,
        score=1.0 if passed else None,
    )
    return EvaluationRecord(candidate_id="c1", stage="full", traces=[], result=result)


def test_the_rule_takes_the_geomean_and_the_worst_workload() -> None:
    search_ev = _ev({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0})
    fresh = _ev({"a": 2.0, "b": 0.5}).result.per_workload
    assert slowdown(search_ev.result.per_workload, fresh) == (
        pytest.approx(1.0),
        pytest.approx(2.0),
    )
    assert reproduced(search_ev, _ev({"a": 1.1, "b": 1.1, "c": 1.1, "d": 1.1}))
    assert not reproduced(search_ev, _ev({"a": 1.2, "b": 1.2, "c": 1.2, "d": 1.2}))  # geomean
    assert not reproduced(search_ev, _ev({"a": 1.6, "b": 0.9, "c": 0.9, "d": 0.9}))  # worst
    assert not reproduced(search_ev, _ev({"a": 1.0, "b": 1.0}, passed=False))
    assert not reproduced(search_ev, _ev({"x": 1.0}))  # nothing in common


def test_a_fresh_jit_worker_starts_with_empty_caches(guard: Guard, problem: Problem) -> None:
    """The same solution, judged with the shared caches and then with ``fresh_jit``: only
    the fresh worker misses the planted pick, and its calls take the 40 ms path."""
    wl = problem.workloads[:1]
    shared = guard.evaluate(pick_solution(), wl)
    fresh = guard.evaluate(pick_solution(), wl, fresh_jit=True)
    assert shared.all_passed and fresh.all_passed, (shared.traces, fresh.traces)
    fast, slow = shared.outcomes[0].latency_ms, fresh.outcomes[0].latency_ms
    assert fast and slow and fast < 20.0 < slow, (fast, slow)
    session = guard.open_session(pick_solution())
    try:
        with pytest.raises(ValueError, match="fresh_jit"):
            guard.evaluate(pick_solution(), wl, session=session, fresh_jit=True)
    finally:
        session.close()


def test_a_best_that_does_not_reproduce_is_replaced_by_the_runner_up(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """B's steady candidate (2 ms per call) is judged first; A's cached-pick candidate
    then wins the search (no sleep with the pick). Confirmed in a new process it sleeps
    40 ms: not reproduced, so B's candidate is confirmed too and handed over, with the
    traces of its confirmation."""
    b = ScriptedAgent([rms("steady", slow="True", sleep_s=0.002)], name="B")
    a = ScriptedAgent([after(b, 1, pick_solution())], name="A")
    run = search(guard, problem, tmp_path, [b, a], budget=2, confirm=True)
    info = run.describe()
    [steady], [picky] = run.ids("B"), run.ids("A")
    full = {e.candidate_id: e.result for e in run.evaluations if e.stage == "full"}
    assert (full[picky].score or 0) > (full[steady].score or 0), info
    first, second = run.payloads("confirmation")
    assert first["of"] == picky and first["reproduced"] is False, info
    assert first["slowdown"] > 1.0 + 0.15, info
    assert second["of"] == steady, info
    best = run.payloads("best")[-1]
    assert best["confirms"] == steady and best["candidate"] == second["candidate"], info
    assert run.agent_of(best["candidate"]) == CONFIRMER
    delivered = load_solution(run.run_dir / "best" / "solution.json")
    assert delivered.content_hash() == rms("steady", slow="True", sleep_s=0.002).content_hash()
    assert run.summary["confirmations"] == sorted([first["candidate"], second["candidate"]])
    assert run.summary["evaluated"] == 2, "confirmations cost no budget"
    assert run.summary["best"]["speedup"] == pytest.approx(second["score"]), info
    lessons = [c for c in run.conclusions if c.agent == CONFIRMER]
    assert [c.candidate_id for c in lessons] == [first["candidate"], second["candidate"]]
    assert lessons[0].outcome == "regressed" and "did not reproduce" in lessons[0].claim
    assert picky in lessons[0].claim and lessons[0].effect["all workloads"] < 1 / 1.15


def test_the_reference_fallback_follows_a_confirmation_slower_than_eager(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """The only candidate wins the search with the cached pick; confirmed in a new process
    it is slower than eager (40 ms per call) with no runner-up, so the reference fallback,
    which comes after the confirmation, judges the reference and hands it over."""
    from kernelarc.orchestration.finish import FALLBACK

    a = ScriptedAgent([pick_solution()], name="A")
    run = search(guard, problem, tmp_path, [a], budget=1, confirm=True, reference_fallback=True)
    info = run.describe()
    [only] = run.payloads("confirmation")
    assert only["reproduced"] is False and (only["score"] or 1.0) < 1.0, info
    [fallback] = run.payloads("fallback")
    assert fallback["instead_of"] == only["candidate"] and fallback["kept"] is True, info
    best = run.payloads("best")[-1]
    assert run.agent_of(best["candidate"]) == FALLBACK and best["reference"] is True, info


def test_a_best_that_reproduces_is_handed_over_after_one_confirmation(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    a = ScriptedAgent([rms("plain")], name="A")
    run = search(guard, problem, tmp_path, [a], budget=1, confirm=True)
    info = run.describe()
    [only] = run.payloads("confirmation")
    assert only["of"] == run.ids("A")[0] and only["passed"] is True, info
    assert run.payloads("best")[-1]["confirms"] == run.ids("A")[0], info


def test_time_is_kept_for_the_confirmation_and_it_is_skipped_without_it(
    guard: Guard, problem: Problem, tmp_path: Path
) -> None:
    """Under a time limit the search keeps ``FRESH_SLOWER`` times the best candidate's
    judging time (screening and full stage) for its confirmation, which runs in a new
    process, when the best can draw at run time (it compiles); a
    solution in eager PyTorch gets no reserve. With no time left the confirmation is
    skipped, says why, and the search's measurement is handed over."""
    import time

    from kernelarc.agents.types import IncumbentView
    from kernelarc.orchestration.confirm import FRESH_SLOWER, confirm
    from kernelarc.orchestration.orchestrator import Orchestrator
    from kernelarc.orchestration.rundir import RunDir
    from kernelarc.store.base import CandidateRecord
    from kernelarc.store.sqlite import SQLiteStore

    a, b = ScriptedAgent([], name="A"), ScriptedAgent([], name="B")
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        compiled = rms_solution("c", rms("c").sources[0].content + "\nrun = torch.compile(run)\n")
        assert draws_at_run_time(compiled) and not draws_at_run_time(rms("c1"))
        assert FRESH_SLOWER == 1.5
        for on, best, kept in ((True, compiled, 6.0), (False, compiled, 0.0), (True, None, 0.0)):
            cfg = run_config(problem, ["A"], time_limit_s=100.0, confirm=on)
            orch = Orchestrator(problem, [a, b], cfg, RunDir(tmp_path), store, guard, {})
            orch.state.full_s.update({"c1": 3.0, "c2": 30.0})
            orch.state.screen_cost.update({"c1": 1.0, "c2": 1.0})
            for agent, cid, score in (("A", "c1", 2.0), ("B", "c2", 1.5)):
                view = IncumbentView(
                    agent=agent,
                    strategy="scripted",
                    candidate_id=cid,
                    score=score,
                    latencies_ms={},
                    solution=best if best and cid == "c1" else rms(cid),
                )
                orch.state.board.update(view, owner=agent)
            # c1's, the best: not c2's 31 s; nothing when c1 cannot draw at run time
            assert orch.clock.reserve() == kept, (on, best)
        rec = store.add_candidate(
            CandidateRecord(
                id="c0001-A",
                content_hash=rms("kept").content_hash(),
                agent="A",
                strategy="scripted",
                mode="draft",
                hypothesis="h",
                solution=rms("kept"),
            )
        )
        orch.clock.started = time.monotonic() - 1000.0  # the limit has passed
        ev = _ev({"u": 1.0})
        judge = orch.finisher.final
        kept_ev = confirm(
            (rec, ev), [(rec, ev)], final=judge, state=orch.state, clock=orch.clock,
            events=orch.events,
        )  # fmt: skip
        assert kept_ev == (rec, ev)
        [skipped] = [e.payload for e in store.events("confirmation_skipped")]
        assert skipped["candidate"] == rec.id and "0 s left" in skipped["why"], skipped
        assert store.events("confirmation") == []
    finally:
        store.close()


def test_a_confirmation_cut_by_the_time_limit_is_no_failure() -> None:
    """A confirmation the run's time limit cut teaches the memory nothing about the
    strategy, and the report says it was cut, not failed (the search's best passed every
    workload)."""
    from kernelarc.orchestration.confirm import _lesson
    from kernelarc.orchestration.judge import TIME_LIMIT
    from kernelarc.report.markdown import render
    from kernelarc.report.trajectory import RunReport, Step
    from kernelarc.store.base import CandidateRecord

    sol = rms("cut")
    rec = CandidateRecord(id="c0005-A", content_hash=sol.content_hash(), agent="A",
                          strategy="scripted", mode="draft", solution=sol)  # fmt: skip
    failed_ev = _ev({"u": 1.0}, passed=False)
    cut = failed_ev.model_copy(
        update={"result": failed_ev.result.model_copy(update={"stopped_early": TIME_LIMIT})}
    )
    lesson = _lesson(rec, (rec, cut), None, False)
    assert lesson.outcome == "no_gain" and "the time limit cut" in lesson.claim, lesson
    failed = _lesson(rec, (rec, failed_ev), None, False)
    assert failed.outcome == "failed" and "did not pass again" in failed.claim, failed

    def step(stopped: str | None) -> Step:
        return Step(order=1, candidate_id="c0012-confirmation", agent=CONFIRMER,
                    strategy="confirmation", parent_id="c0005-A", at_s=1.0, stage="full",
                    passed=False, score=None, stopped=stopped, improved=False,
                    best_so_far=None, hypothesis="h")  # fmt: skip

    def text(stopped: str | None) -> str:
        return render(RunReport(run_dir="r", summary={"problem": "p"}, config={},
                                steps=[step(stopped)], best_id=None, best_origin=None,
                                best_workloads=[], conclusions=[], notable=[]))  # fmt: skip

    assert f"| cut ({TIME_LIMIT}) |" in text(TIME_LIMIT)
    assert "| failed (see traces) |" in text(None)
