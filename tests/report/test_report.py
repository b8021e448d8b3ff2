"""The run report (``kernelarc.report``, ``kernelarc report``): built from a real search on
the CPU (a real guard and store, scripted agents), read back and rendered."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from data.orchestrator.harness import (
    EXAMPLE,
    GUARD_CONFIG,
    Search,
    fails,
    kernelarc,
    rms,
    search,
)

from kernelarc.errors import KernelArcError
from kernelarc.guard.evaluator import Guard
from kernelarc.problem.loader import load_problem
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.report import PICTURE, write_report
from kernelarc.report.markdown import render
from kernelarc.report.trajectory import RunReport, read_run
from kernelarc.store.sqlite import SQLiteStore


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Search]:
    """A passes, then fails; B's first candidate fails, its second is slower than A's (it
    passes, or is stopped as hopeless at screening)."""
    problem = load_problem(EXAMPLE)
    a = ScriptedAgent([rms("ra0"), *fails("ra_f", 1)], name="A", strategy="alpha")
    b = ScriptedAgent([*fails("rb_f", 1), rms("rb1", slow="True", sleep_s=0.004)], name="B")
    with Guard(problem, GUARD_CONFIG) as guard:
        yield search(guard, problem, tmp_path_factory.mktemp("report"), [a, b], budget=4)


def _read(run: Search) -> RunReport:
    store = SQLiteStore(run.run_dir / "store.sqlite", readonly=True)
    try:
        return read_run(store, run.run_dir)
    finally:
        store.close()


def test_the_trajectory_is_every_judged_candidate_in_order(run: Search) -> None:
    data = _read(run)
    judged = [p["candidate"] for p in run.payloads("evaluated")]
    assert [s.candidate_id for s in data.steps] == judged, run.describe()
    assert len(data.steps) == run.summary["evaluated"] == 4
    assert [s.order for s in data.steps] == [1, 2, 3, 4]
    assert all(b.at_s >= a.at_s >= 0 for a, b in zip(data.steps, data.steps[1:], strict=False))
    names = {c.id: c.solution.name for c in run.candidates}
    for s in data.steps:  # the failing ones (every call raises) fail at screening
        if "_f" in names[s.candidate_id]:
            assert (s.passed, s.score, s.stage) == (False, None, "screen"), s
    full = [s.score for s in data.steps if s.stage == "full" and s.score]
    assert data.steps[-1].best_so_far == pytest.approx(max(full))
    assert data.best_id == run.summary["best"]["candidate_id"]
    assert len(data.best_workloads) == 6 and data.conclusions


def test_the_report_shows_result_trajectory_and_lessons(run: Search) -> None:
    written = write_report(run.run_dir)
    text = written.report.read_text()
    assert written.report == run.run_dir / "report.md"
    assert text.startswith("# KernelArc run: ka_rmsnorm_h512")
    best = run.summary["best"]["candidate_id"]
    assert f"(candidate `{best}`)" in text and "6/6 workloads passed" in text
    trajectory = text.split("## Trajectory")[1].split("## Lessons learned")[0]
    rows = [line for line in trajectory.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 4  # the header and one row per judged candidate
    assert sum("failed" in r for r in rows) >= 2  # the two failing (the slow one may stop)
    lessons = text.split("## Lessons learned")[1]
    for c in run.conclusions:
        assert c.claim[:60] in lessons, c.claim
    assert written.picture == run.run_dir / PICTURE and written.note is None
    assert written.picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"![trajectory]({PICTURE})" in text


def test_without_matplotlib_the_report_says_there_is_no_picture(
    run: Search, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without it does
    written = write_report(run.run_dir, tmp_path / "r.md")
    text = written.report.read_text()
    assert written.picture is None and not (tmp_path / "r.png").exists()
    assert written.note and "kernelarc[report]" in written.note
    assert "![trajectory]" not in text and "matplotlib is not installed" in text


def test_a_run_without_a_solution_says_so(run: Search) -> None:
    data = _read(run)
    none = {"kind": "no_solution", "why": "no candidate passed the full protocol"}
    empty = data.model_copy(
        update={"summary": {**data.summary, "best": None}, "steps": [], "notable": [none]}
    )
    text = render(empty)
    assert "**No solution passed the full protocol.**" in text
    assert "No candidate was judged." in text


@pytest.mark.parametrize("stopped", [None, "every agent is done"])
def test_an_unfinished_run_is_not_called_a_run_without_a_solution(
    run: Search, stopped: str | None
) -> None:
    """A run killed after candidates passed (for instance while it confirmed its choice)
    has no solution yet, but it is not a run where none passed: the report says so and
    names the best judged so far."""
    data = _read(run)
    unfinished = data.model_copy(
        update={"summary": {**data.summary, "best": None, "stopped": stopped}, "notable": []}
    )
    result = render(unfinished).split("## Trajectory")[0]
    assert "No solution passed" not in result
    assert "**The run has not finished" in result
    assert (
        f"`kernelarc optimize {data.config['problem']} --run-dir {data.run_dir} --resume`" in result
    )
    assert ("during its search" in result) == (stopped is None)
    full = [s for s in data.steps if s.stage == "full" and s.passed and s.score]
    top = max(full, key=lambda s: s.score or 0.0)
    assert f"{len(full)} judgement(s) passed the full protocol so far" in result
    assert f"`{top.candidate_id}` ({top.agent})" in result


def test_report_of_a_directory_without_a_run(tmp_path: Path) -> None:
    with pytest.raises(KernelArcError, match="not a run directory"):
        write_report(tmp_path)
    p = kernelarc(["report", str(tmp_path)], tmp_path, 60)
    assert p.returncode == 2 and "not a run directory" in p.stderr, p.stderr


def test_the_cli_writes_the_report_where_asked(run: Search, tmp_path: Path) -> None:
    out = tmp_path / "out" / "run.md"
    p = kernelarc(["report", str(run.run_dir), "-o", str(out)], tmp_path, 120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(out)
    assert out.read_text().startswith("# KernelArc run:")
    assert (out.parent / "run.png").is_file() and not (out.parent / PICTURE).exists()
