"""How the orchestrator finishes a search, end to end on the CPU: the shape-gated composition
of the agents' shape winners kept as the best solution, the reference fallback (and when
it does not apply), a resumed finish composing afresh, no composition without the time
its parts took, each stage's time accounted, ``kernelarc status --json`` of a composed run.

Every search is real (one ``Guard`` per module, the bundled example ``rmsnorm_h512``, a real
``SQLiteStore`` and ``RunDir``); the agents are scripted fakes whose variants differ in speed
by ``time.sleep`` on chosen batch sizes (the harness is ``tests/data/orchestrator/``). The
tests that finish the composed run again do so on copies of it.

Not covered: confirmation of the chosen solution in a new process (test_confirm.py), CUDA.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from data.orchestrator.harness import (
    Search,
    after,
    check_status_contract,
    example_guard,
    example_problem,
    kernelarc,
    rms,
    run_config,
    search,
)

from kernelarc.guard.evaluator import Guard
from kernelarc.guard.protocol import ROUND_PARTS
from kernelarc.orchestration.finish import COMPOSER, FALLBACK
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.loader import Problem, load_solution
from kernelarc.problem.schema import Trace
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.store.sqlite import SQLiteStore

# ---------------------------------------------------------------- fixtures


problem = pytest.fixture(scope="module")(example_problem)
guard = pytest.fixture(scope="module")(example_guard)


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
    first = compose_run
    assert len(first.payloads("composition")) == 1, first.describe()
    a_id, b_id = first.ids("A")[0], first.ids("B")[0]
    run_dir = resumable_copy(first, tmp_path)
    config = run_config(problem, ["A", "B"], budget=2, time_limit_s=100.0)
    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        orch = Orchestrator(problem, split_agents("c"), config, RunDir(run_dir), store, guard, {})
        orch.clock.started -= 80.0  # 20 s of the 100 s left
        orch.state.full_s.update({a_id: 50.0, b_id: 1.0})
        orch.finisher.finish()
        skipped = [e.payload for e in store.events() if e.kind == "composition_skipped"]
        assert len(skipped) == 1 and "s left, under the 50 s its parts took" in skipped[0]["why"]
        assert len([e for e in store.events() if e.kind == "composition"]) == 1, "none new"
        orch.state.full_s.update({a_id: 5.0})
        orch.finisher.finish()
        assert len([e for e in store.events() if e.kind == "composition"]) == 2
    finally:
        store.close()


def test_a_stop_signal_while_the_composition_is_planned_waits_for_the_next_judgement(
    guard: Guard,
    problem: Problem,
    compose_run: Search,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the composition's judgement is cut by a stop signal: one that comes while the
    composition is planned waits, here (nothing worth judging, no confirmation) until the
    handover: a signal meant for the confirmation is not recorded against a composition
    that would not have run."""
    import os
    import signal

    from kernelarc.orchestration import finish

    def signalled(*args: object) -> float:
        os.kill(os.getpid(), signal.SIGTERM)
        return 1.0  # no gain: skipped

    monkeypatch.setattr(finish, "predicted_gain", signalled)
    config = run_config(problem, ["A", "B"], budget=2)
    store = SQLiteStore(resumable_copy(compose_run, tmp_path) / "store.sqlite")
    orch = Orchestrator(
        problem, split_agents("c"), config, RunDir(tmp_path / "run"), store, guard, {}
    )
    orch.events.sigint.install()
    try:
        orch.finisher.finish()
        kinds = [(e.kind, e.payload.get("during")) for e in store.events()[-4:]]
    finally:
        orch.events.sigint.uninstall()
        store.close()
    assert kinds == [
        ("composition_skipped", None),
        ("best", None),
        ("finished", None),
        ("interrupted", "handover"),
    ]


def test_each_stage_says_where_its_time_went(compose_run: Search) -> None:
    """The evaluated events carry each stage's phases (the guard's own accounting; a worker
    started ahead, as the warm spare is, counts its start though it overlapped earlier work),
    and where the correctness rounds' time went in the workers. The reference's parts are
    not required: its outputs are cached across candidates, so a stage may run it not once."""
    seen: set[str] = set()
    for payload in compose_run.payloads("evaluated"):
        for name, stage in payload["stages"].items():
            phases = stage["phases_s"]
            seen |= set(phases)
            assert {"correctness", "timing", "recheck"} <= set(phases), (name, phases)
            assert all(v >= 0 for v in phases.values()), (name, phases)
            assert phases["correctness"] + phases["timing"] <= stage["wall_s"] + 0.05
            # the rounds' parts, as the workers measured them, inside the parent's phases
            parts = [f"round.candidate.{p}" for p in ROUND_PARTS]
            parts.append("round.compare")
            assert set(parts) <= set(phases), (name, phases)
            rounds = sum(v for k, v in phases.items() if k.startswith("round."))
            assert rounds <= phases["correctness"] + phases["recheck"] + 0.05, (name, phases)
    assert {"round.reference.inputs", "round.reference.call"} <= seen


def test_status_evaluated_counts_only_budgeted_candidates(compose_run: Search) -> None:
    assert compose_run.summary["evaluated"] == compose_run.summary["budget"] == 2


# ---------------------------------------------------------------- the CLI


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
