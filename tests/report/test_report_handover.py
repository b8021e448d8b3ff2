"""The report of the hand-over, from runs on a FAKE guard (``tests/orchestration/
fake_guard.py``) with a real SQLite store: the reference handed back says no candidate was
significantly faster, a handed-over candidate is named with its agent, its figure and its
slower workloads, a broken reference says so, the picture marks the hand-over, and
``report -o X.md`` writes its picture to ``X.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from data.orchestrator.harness import rms, run_config
from orchestration.fake_guard import FakeGuard, InlineExecutor
from orchestration.test_loop_fast import PROBLEM, SMALL, composed_or_reference, split

from kernelarc.orchestration.finish import NO_GAIN
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.proposers.scripted import ScriptedAgent
from kernelarc.report import PICTURE, picture_beside, write_report
from kernelarc.report.plot import handed_over
from kernelarc.report.trajectory import read_run
from kernelarc.store.sqlite import SQLiteStore


def finished_run(run_dir: Path, guard: FakeGuard, tag: str, **overrides: Any) -> Path:
    """A one-candidate run (``rms_<tag>``) on ``guard``, in ``run_dir`` with its store."""
    agents = [ScriptedAgent([rms(tag)], name="A")]
    config = run_config(PROBLEM, ["A"], reference_fallback=True, **overrides)
    run_dir.mkdir(parents=True)
    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        orch = Orchestrator(
            PROBLEM, agents, config, RunDir(run_dir), store, guard, {},
            executor=InlineExecutor(),
        )  # fmt: skip
        guard.attach(orch.clock)
        orch.run()
    finally:
        store.close()
    return run_dir


def test_the_reference_handed_back_says_no_candidate_was_faster(tmp_path: Path) -> None:
    guard = FakeGuard(PROBLEM, script={"rms_n": 0.99}, verdict=composed_or_reference({}, 1.6))
    run_dir = finished_run(tmp_path / "run", guard, "n")
    written = write_report(run_dir)
    text = written.report.read_text().split("## Trajectory")[0]
    assert f"**{NO_GAIN[0].upper()}{NO_GAIN[1:]}**" in text, text
    store = SQLiteStore(run_dir / "store.sqlite", readonly=True)
    try:
        data = read_run(store, run_dir)
    finally:
        store.close()
    mark = handed_over(data)
    assert mark is not None and mark[1] == 1.0 and "the reference" in mark[2], mark
    assert written.picture == run_dir / PICTURE and written.picture.is_file()


def test_a_handed_over_candidate_is_named_with_its_slower_workloads(tmp_path: Path) -> None:
    guard = FakeGuard(PROBLEM, script={"rms_f": split(0.25, 1.25)})
    run_dir = finished_run(tmp_path / "run", guard, "f")
    text = write_report(run_dir).report.read_text().split("## Trajectory")[0]
    assert "Handed over: `c0001-A` of agent `A`" in text, text
    n_slower = len(PROBLEM.workloads) - len(SMALL)
    assert f"Slower than the reference on {n_slower} workload(s):" in text, text
    assert "(0.80×)" in text, text
    store = SQLiteStore(run_dir / "store.sqlite", readonly=True)
    try:
        mark = handed_over(read_run(store, run_dir))
    finally:
        store.close()
    assert mark is not None and mark[2].startswith("handed over: c0001-A"), mark


def test_a_broken_reference_is_reported_as_broken(tmp_path: Path) -> None:
    guard = FakeGuard(PROBLEM, verdict=lambda s, w: "INVALID_REFERENCE")
    run_dir = finished_run(tmp_path / "run", guard, "b")
    text = write_report(run_dir).report.read_text()
    assert "**The reference is broken: it fails on every screened workload**" in text, text
    assert "`INVALID_REFERENCE (scripted)`" in text and "--solution" not in text, text


def test_report_output_elsewhere_draws_its_own_picture(tmp_path: Path) -> None:
    """``-o X.md`` writes its picture to ``X.png``; a ``trajectory.png`` beside it is left
    alone."""
    guard = FakeGuard(PROBLEM, script={"rms_o": 0.5})
    run_dir = finished_run(tmp_path / "run", guard, "o")
    elsewhere = tmp_path / "out"
    elsewhere.mkdir()
    (elsewhere / PICTURE).write_bytes(b"not ours")
    written = write_report(run_dir, elsewhere / "X.md")
    assert written.picture == elsewhere / "X.png" and written.picture.is_file()
    assert (elsewhere / PICTURE).read_bytes() == b"not ours"
    assert "![trajectory](X.png)" in written.report.read_text()


@pytest.mark.parametrize(
    ("out", "picture"),
    [("a/X.md", "a/X.png"), ("X", "X.png"), ("r.v2.md", "r.v2.png"), ("p.png", "p.png.png")],
)
def test_picture_beside(out: str, picture: str) -> None:
    assert picture_beside(Path(out)) == Path(picture)
