"""``kernelarc status`` on runs made on a FAKE guard (``tests/orchestration/fake_guard.py``)
with a real SQLite store: the handed-over candidate (id, agent, its hand-over figure) and its
slower workloads, the reference handed back with the plain verdict, a broken reference, the
judgements at the end counted, the run's state and elapsed time; ``--json`` keeps its keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from orchestration.fake_guard import FakeGuard
from orchestration.test_loop_fast import PROBLEM, composed_or_reference, split
from report.test_report_handover import finished_run
from rich.console import Console
from typer.testing import CliRunner

from kernelarc.cli.main import app
from kernelarc.cli.status_cmd import print_status
from kernelarc.orchestration.finish import NO_GAIN

KEYS = {
    "problem", "budget", "evaluated", "passed", "agents", "conclusions", "candidate_ids",
    "composed", "fallback", "confirmations", "workloads", "best", "stopped",
}  # fmt: skip


def status(run_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["status", str(run_dir), *args], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_status_names_the_handed_over_candidate_and_its_slower_workloads(tmp_path: Path) -> None:
    guard = FakeGuard(PROBLEM, script={"rms_f": split(0.25, 1.25)})
    run_dir = finished_run(tmp_path / "run", guard, "f", confirm=True)
    text = status(run_dir)
    assert "c0002-confirmation of agent A, the confirmation of c0001-A" in text, text
    assert "all workloads passed, 1.37× over the eager reference" in text, text
    assert "slower than the reference on 4 workload(s): batch_size=16 (0.80×)" in text, text
    assert "evaluated 1 (+1 judged at the end)" in text, text
    assert "; finished after" in text, text
    assert "--solution" not in text, text
    data = json.loads(CliRunner().invoke(app, ["status", str(run_dir), "--json"]).output)
    assert KEYS <= set(data), sorted(KEYS - set(data))
    assert data["state"] == "finished" and data["running"] is False, data
    assert data["best"]["agent"] == "A" and data["best"]["confirms"] == "c0001-A", data


def test_status_says_no_candidate_was_significantly_faster(tmp_path: Path) -> None:
    guard = FakeGuard(PROBLEM, script={"rms_n": 0.99}, verdict=composed_or_reference({}, 1.6))
    text = status(finished_run(tmp_path / "run", guard, "n"))
    assert f"(the reference itself, c0002-reference-fallback): {NO_GAIN}" in text, text
    assert "it read 0.62× of itself: the measurement's noise" in text, text


def test_status_of_a_broken_reference_suggests_no_solution(tmp_path: Path) -> None:
    guard = FakeGuard(PROBLEM, verdict=lambda s, w: "INVALID_REFERENCE")
    run_dir = finished_run(tmp_path / "run", guard, "b", workloads=[PROBLEM.workloads[0].uuid])
    text = status(run_dir)
    assert "the reference is broken: INVALID_REFERENCE (scripted)" in text, text
    assert "stopped: the reference is broken" in text, text
    assert "--solution" not in text and "no solution passed" not in text, text


def test_status_of_a_running_run(tmp_path: Path) -> None:
    """A summary without its end, while the store's writer is alive, is a running run."""
    summary = {"problem": "p", "agents": [], "best": None, "state": "running", "elapsed_s": 125}
    console = Console(record=True, width=200)
    print_status(summary, console)
    text = console.export_text()
    assert "running after 2 min 05 s" in text and "the run is still going" in text, text


def test_status_names_the_command_as_the_user_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped run's advice names ``./ka`` when the CLI was started by ``./ka``."""
    monkeypatch.setenv("KERNELARC_PROG", "./ka")
    summary = {"problem": "p", "agents": [], "best": None, "state": "stopped", "elapsed_s": 5}
    console = Console(record=True, width=200)
    print_status(summary, console)
    text = console.export_text()
    assert "`./ka optimize PROBLEM_DIR --run-dir RUN_DIR --resume`" in text, text
    assert "kernelarc optimize" not in text, text
