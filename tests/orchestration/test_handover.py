"""The hand-over on a FAKE guard (``fake_guard.py``): the reference is handed back unless a
candidate is significantly faster than it, the figure handed over is the hand-over's own
judgement, workloads slower than the reference are named, a reference broken on every
screened workload stops the run at once, and the summary tells a finished run from a
running or stopped one."""

from __future__ import annotations

import os
from pathlib import Path

from data.orchestrator.harness import rms
from orchestration.fake_guard import FakeGuard
from orchestration.test_loop_fast import PROBLEM, SMALL, Run, composed_or_reference, split

from kernelarc.orchestration.confirm import CONFIRMER
from kernelarc.orchestration.finish import FALLBACK, NO_GAIN, run_status
from kernelarc.problem.reference import reference_solution
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.store.memory import MemoryStore


def fake(**kw: object) -> FakeGuard:
    return FakeGuard(PROBLEM, **kw)  # type: ignore[arg-type]


def test_a_candidate_not_significantly_faster_hands_over_the_reference(tmp_path: Path) -> None:
    """1.01x over the reference is within the noise (``min_gain`` 0.02): the reference is
    judged in full and handed over, and the summary says why."""
    guard = fake(script={"rms_n": 0.99}, verdict=composed_or_reference({}, 1.0))
    run = Run(tmp_path, [ScriptedAgent([rms("n")], name="A")], guard, reference_fallback=True)
    run.run()
    info = run.describe()
    [fallback] = run.payloads("fallback")
    assert fallback["kept"] is True and fallback["instead_of"] == run.ids("A")[0], info
    assert run.best()["candidate"] == run.ids(FALLBACK)[0] and run.best()["reference"], info
    best = run.summary["best"]
    assert best["is_reference"] is True and best["verdict"] == NO_GAIN, run.summary
    assert best["agent"] == FALLBACK and best["slower_workloads"] == [], run.summary


def test_a_significantly_faster_candidate_is_handed_over(tmp_path: Path) -> None:
    """2x over the reference: no fallback; the workloads where it is slower than the
    reference are named with their speedup."""
    guard = fake(script={"rms_f": split(0.25, 1.25)})
    run = Run(tmp_path, [ScriptedAgent([rms("f")], name="A")], guard, reference_fallback=True)
    run.run()
    info = run.describe()
    assert run.payloads("fallback") == [], info
    best = run.summary["best"]
    assert best["candidate_id"] == run.ids("A")[0] and best["is_reference"] is False, info
    assert best["agent"] == "A" and best["verdict"] is None, best
    slower = best["slower_workloads"]
    assert {s["uuid"] for s in slower} == {u.uuid for u in PROBLEM.workloads} - SMALL, best
    assert all(abs(s["speedup"] - 0.8) < 1e-9 for s in slower), best


def test_a_confirmation_that_does_not_reproduce_hands_over_the_reference(tmp_path: Path) -> None:
    """The only candidate reads 2x in the search and 0.67x in a new process (not
    reproduced); the reference, judged in full, reads 0.67x of itself too. The reference is
    handed over, never the confirmation that is slower than it."""
    guard = fake(
        script={"rms_c": 0.5},
        fresh={"rms_c": 1.5},
        verdict=composed_or_reference({}, 1.5),
    )
    agents = [ScriptedAgent([rms("c")], name="A")]
    run = Run(tmp_path, agents, guard, reference_fallback=True, confirm=True).run()
    info = run.describe()
    [confirmation] = run.payloads("confirmation")
    assert confirmation["reproduced"] is False, info
    assert run.best()["candidate"] == run.ids(FALLBACK)[0], info
    assert run.summary["best"]["verdict"] == NO_GAIN, run.summary
    assert run.summary["judged_at_end"] == 2, run.summary  # the confirmation, the reference
    assert run.ids(CONFIRMER) == run.summary["confirmations"], run.summary


def test_a_broken_reference_stops_the_run_at_once(tmp_path: Path) -> None:
    """The reference fails on every screened workload: the search stops after the first
    judgement, with the reference's error, no budget spent on the rest, and no solution."""
    guard = fake(verdict=lambda s, w: "INVALID_REFERENCE")
    steps = [rms("b1"), rms("b2"), rms("b3")]
    run = Run(tmp_path, [ScriptedAgent(steps, name="A")], guard, budget=3).run()
    info = run.describe()
    assert run.orch.state.used == 1 and guard.judged() == ["rms_b1"], info
    screened = [w.uuid for w in run.orch.judge.screen_set]
    assert guard.calls[0].workloads == screened, "the screening goes on past the reference's error"
    [broken] = run.payloads("reference_broken")
    assert broken["error"] == "INVALID_REFERENCE (scripted)", info
    assert run.stopped() == "the reference is broken", info
    [none] = run.payloads("no_solution")
    assert none["why"] == "the reference is broken: INVALID_REFERENCE (scripted)", info
    assert "common_failure" not in none, info
    assert run.summary["best"] is None, run.summary
    assert run.summary["reference_broken"] == broken["error"], run.summary


def test_a_reference_failing_on_one_screened_workload_does_not_stop_the_run(
    tmp_path: Path,
) -> None:
    """A reference that fails on one workload only is no broken reference: the search goes on."""
    bad = sorted(SMALL)[0]
    guard = fake(verdict=lambda s, w: "INVALID_REFERENCE" if w.uuid == bad else 0.5)
    steps = [rms("p1"), rms("p2")]
    run = Run(tmp_path, [ScriptedAgent(steps, name="A")], guard, budget=2).run()
    info = run.describe()
    assert run.payloads("reference_broken") == [] and run.orch.state.used == 2, info


def test_the_summary_tells_finished_running_and_stopped_runs(tmp_path: Path) -> None:
    """``finished`` once the run logged its end; before it, ``running`` while the pid in the
    store's lock file is alive, ``stopped`` when it is not; with the elapsed time."""
    run = Run(tmp_path / "done", [ScriptedAgent([rms("s")], name="A")], fake(script={"rms_s": 0.5}))
    run.run()
    assert run.summary["state"] == "finished" and run.summary["running"] is False, run.summary
    assert run.summary["elapsed_s"] is not None and run.summary["elapsed_s"] >= 0, run.summary

    store = MemoryStore()
    store.log_event("run_config", {"definition": "x", "agents": []})
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    lock = run_dir / "store.sqlite.lock"
    lock.write_text(f"{os.getpid()}\n")
    live = run_status(store, run_dir)
    assert live["state"] == "running" and live["running"] is True, live
    lock.write_text(f"{_dead_pid()}\n")
    assert run_status(store, run_dir)["state"] == "stopped"
    store.log_event("finished", {"handed_over": False})
    assert run_status(store, run_dir)["state"] == "finished"
    store.log_event("run_config", {"definition": "x", "agents": []})  # resumed
    lock.write_text(f"{os.getpid()}\n")
    assert run_status(store, run_dir)["state"] == "running"


def _dead_pid() -> int:
    """A pid no process has (a child that has exited and been reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_reference_whose_own_code_fails_stops_the_run_after_it(tmp_path: Path) -> None:
    """The reference raises in the candidate's worker (a candidate built on it fails the
    same way, before the guard's reference runs): after the first failure, the reference's
    own proposal is judged next, screened on every screened workload, and stops the run."""
    ref_name = f"{PROBLEM.definition.name}-reference"

    def verdict(solution: object, wl: object) -> str:
        return "RUNTIME_ERROR"

    guard = fake(verdict=verdict)
    a = ScriptedAgent([rms("x1"), rms("x2"), rms("x3")], name="A")
    ref = reference_solution(PROBLEM.definition, agent="R", description="the reference")
    r = ScriptedAgent([ref], name="R")
    run = Run(tmp_path, [a, r], guard, budget=4).run()
    info = run.describe()
    assert guard.judged() == ["rms_x1", ref_name], info
    screened = [w.uuid for w in run.orch.judge.screen_set]
    assert guard.calls[1].workloads == screened, info
    assert run.stopped() == "the reference is broken", info
    assert run.summary["reference_broken"] == "RUNTIME_ERROR (scripted)", run.summary
