"""`kernelarc optimize --workloads`: a run that judges a subset of the problem's workloads
(for problems whose full judgement does not fit the user's time), recorded in the run's
configuration so that `--resume` keeps it, and said in the status; the guard's timer
(`--cupti`), recorded the same way. The runs that judge start together."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path

import pytest
from _shared import started_ahead
from data.orchestrator.harness import kernelarc

from kernelarc.problem.loader import load_problem

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
FAST = ["--device", "cpu", "--full-iterations", "5", "--full-warmup", "1", "--no-confirm"]


def _judged_uuids(run_dir: Path) -> set[str]:
    lines = (run_dir / "traces.jsonl").read_text().splitlines()
    return {json.loads(x)["workload"]["uuid"] for x in lines if x.strip()}


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[None]]]:
    """The runs of the tests that judge (each below, with its checks, in a folder of its
    own), started together (``_shared``'s ``started_ahead``): none checks a timing."""
    jobs: dict[str, Callable[[], None]] = {
        name: partial(job, tmp_path_factory.mktemp("run"))
        for name, job in (
            (
                "test_a_run_on_chosen_workloads_judges_only_those_and_resume_keeps_them",
                _chosen_workloads_then_resumed,
            ),
            ("test_a_full_run_says_nothing_of_workloads", _a_full_run),
            (
                "test_the_timer_is_checked_and_recorded_in_the_run_configuration",
                _the_timer_checked_and_recorded,
            ),
        )
    }
    yield from started_ahead(request, jobs)


def test_a_run_on_chosen_workloads_judges_only_those_and_resume_keeps_them(
    runs: dict[str, Future[None]],
) -> None:
    """``_chosen_workloads_then_resumed``, run by ``runs``."""
    runs["test_a_run_on_chosen_workloads_judges_only_those_and_resume_keeps_them"].result()


def test_a_full_run_says_nothing_of_workloads(runs: dict[str, Future[None]]) -> None:
    """``_a_full_run``, run by ``runs``."""
    runs["test_a_full_run_says_nothing_of_workloads"].result()


def test_the_timer_is_checked_and_recorded_in_the_run_configuration(
    runs: dict[str, Future[None]],
) -> None:
    """``_the_timer_checked_and_recorded``, run by ``runs``."""
    runs["test_the_timer_is_checked_and_recorded_in_the_run_configuration"].result()


def _chosen_workloads_then_resumed(tmp_path: Path) -> None:
    uuids = [w.uuid for w in load_problem(EXAMPLE).workloads]
    run_dir = tmp_path / "run"
    base = ["optimize", str(EXAMPLE), "--agents", "reference", "--run-dir", str(run_dir), *FAST]
    p = kernelarc([*base, "--budget", "1", "--workloads", f"0,{uuids[2][:14]}"], tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "judging 2 of the problem's 6 workloads" in p.stderr, p.stderr
    assert "judged on 2 workloads only" in p.stdout, p.stdout
    assert _judged_uuids(run_dir) == {uuids[0], uuids[2]}
    assert f"report: {run_dir / 'report.md'}" in p.stderr, p.stderr  # written at the end
    assert "judged 2 chosen workload(s) only" in (run_dir / "report.md").read_text()
    status = json.loads(kernelarc(["status", str(run_dir), "--json"], tmp_path, 120).stdout)
    assert status["workloads"] == [uuids[0], uuids[2]], status
    assert status["best"]["all_passed"] is True, status

    # --resume keeps the run's own workloads, and says so when given others; the run is
    # finished, so nothing is judged again
    again = kernelarc([*base, "--budget", "1", "--resume", "--workloads", "1"], tmp_path, 300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "--workloads is not this run's" in again.stderr, again.stderr
    assert "is finished (budget spent)" in again.stderr, again.stderr
    assert _judged_uuids(run_dir) == {uuids[0], uuids[2]}


def test_an_unknown_workload_is_a_usage_error_before_any_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    p = kernelarc(
        ["optimize", str(EXAMPLE), "--run-dir", str(run_dir), "--workloads", "0,17", *FAST],
        tmp_path,
        120,
    )
    assert p.returncode == 2, p.stderr
    assert "workload index 17 is out of range" in p.stderr, p.stderr
    assert not run_dir.exists()


def _a_full_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["optimize", str(EXAMPLE), "--agents", "reference", "--budget", "1"]
    p = kernelarc([*args, "--run-dir", str(run_dir), *FAST, "--json"], tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "of the problem's" not in p.stderr
    assert json.loads(p.stdout)["workloads"] is None
    assert len(_judged_uuids(run_dir)) == 6


def _the_timer_checked_and_recorded(tmp_path: Path) -> None:
    from kernelarc.store.sqlite import SQLiteStore

    run_dir = tmp_path / "run"
    args = ["optimize", str(EXAMPLE), "--agents", "reference", "--budget", "1", *FAST]
    bad = kernelarc([*args, "--run-dir", str(run_dir), "--cupti", "maybe"], tmp_path, 120)
    assert bad.returncode == 2 and "--cupti must be auto, on or off" in bad.stderr
    assert not run_dir.exists()
    p = kernelarc([*args, "--run-dir", str(run_dir), "--cupti", "off"], tmp_path, 300)
    assert p.returncode == 0, p.stderr[-3000:]
    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        assert store.open_run({})["cupti"] == "off"
    finally:
        store.close()
