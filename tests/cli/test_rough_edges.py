"""The CLI's edges a new user meets first: a bad option is one line naming it and its range,
a rejected command leaves no run directory, ``--resume`` never ignores an option and never
judges a finished run again, problem trees may be symlinked, progress lines are short, and
messages name the command as invoked and are not cut at 80 columns when piped."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kernelarc import env
from kernelarc.cli import optimize_cmd
from kernelarc.cli.main import app
from kernelarc.problem.discover import find_problems
from kernelarc.store.sqlite import SQLiteStore

runner = CliRunner()
KERNELARC = Path(sys.executable).with_name("kernelarc")


def _one_error_line(result: Any) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "validation error" not in result.output and "pydantic" not in result.output
    return lines[0]


@pytest.mark.parametrize(
    ("option", "value", "rule"),
    [
        ("--budget", "0", "at least 1"),
        ("--budget", "-1", "at least 1"),
        ("--time-limit", "-5", "greater than 0"),
        ("--timeout", "0", "greater than 0"),
        ("--patience", "0", "at least 1"),
        ("--compile-workers", "-1", "at least 0"),
        ("--budget-per-agent", "0", "at least 1"),
        ("--full-iterations", "1", "at least 3"),
        ("--full-warmup", "-1", "at least 0"),
    ],
)
def test_a_numeric_option_out_of_range_is_one_line_naming_it(
    example: Path, tmp_path: Path, option: str, value: str, rule: str
) -> None:
    run_dir = tmp_path / "run"
    args = ["optimize", str(example), "--run-dir", str(run_dir), option, value]
    line = _one_error_line(runner.invoke(app, args))
    assert f"{option} must be {rule}" in line, line
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--agents", "compilr", "unknown agent name"),
        ("--agents", "reference,reference", "given twice"),
        ("--device", "gpu", "unknown device"),
        ("--cupti", "maybe", "--cupti must be auto, on or off"),
    ],
)
def test_a_rejected_option_leaves_no_run_directory(
    example: Path, tmp_path: Path, option: str, value: str, said: str
) -> None:
    run_dir = tmp_path / "run"
    args = ["optimize", str(example), "--run-dir", str(run_dir), option, value]
    assert said in _one_error_line(runner.invoke(app, args))
    assert not run_dir.exists()


def test_device_cuda_without_a_gpu_leaves_no_run_directory(example: Path, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    run_dir = tmp_path / "run"
    args = ["optimize", str(example), "--run-dir", str(run_dir), "--device", "cuda"]
    assert "no CUDA device" in _one_error_line(runner.invoke(app, args))
    assert not run_dir.exists()


def _finished_run(example: Path, run_dir: Path) -> list[Any]:
    """A run directory whose store records a finished run (budget spent, best handed over);
    returns its events."""
    run_dir.mkdir()
    config = {
        "problem": str(example),
        "definition": "ka_rmsnorm_h512",
        "agents": ["reference"],
        "budget": 1,
        "device": "cpu",
        "confirm": False,
        "full": {"rounds": 10, "warmup": 1, "iterations": 5},
    }
    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        store.log_event("run_config", store.open_run(config))
        store.log_event("search_stopped", {"reason": "budget spent", "used": 1})
        store.log_event("no_solution", {"why": "no candidate passed the full protocol"})
        return store.events()
    finally:
        store.close()


def _events(run_dir: Path) -> list[Any]:
    store = SQLiteStore(run_dir / "store.sqlite", readonly=True)
    try:
        return store.events()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--budget", "4"], "--budget (this run's: 1)"),
        (["--agents", "compiler"], "--agents (this run's: reference)"),
        (["--device", "auto"], "--device (this run's: cpu)"),
        (["--full-iterations", "50"], "--full-iterations (this run's: 5)"),
        (["--no-confirm"], None),  # the run's own value: accepted
    ],
)
def test_resume_refuses_an_option_it_cannot_change_and_names_it(
    example: Path, tmp_path: Path, extra: list[str], named: str | None
) -> None:
    run_dir = tmp_path / "run"
    before = _finished_run(example, run_dir)
    args = ["optimize", str(example), "--run-dir", str(run_dir), "--resume", *extra]
    result = runner.invoke(app, args)
    if named is None:
        assert result.exit_code == 1, result.output  # finished, with no solution
        assert "is finished" in result.stderr
    else:
        line = _one_error_line(result)
        assert named in line and "cannot change" in line, line
    assert _events(run_dir) == before  # nothing judged, nothing recorded


def test_resume_of_a_finished_run_judges_nothing_and_prints_its_status(
    example: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    before = _finished_run(example, run_dir)
    args = ["optimize", str(example), "--run-dir", str(run_dir), "--resume", "--json"]
    result = runner.invoke(app, args)
    assert "is finished (budget spent)" in result.stderr, result.output
    assert json.loads(result.stdout)["budget"] == 1
    assert _events(run_dir) == before


def test_resume_of_another_problems_run_is_refused(example: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = _finished_run(example, run_dir)
    other = example.parent / "gemm_small"
    args = ["optimize", str(other), "--run-dir", str(run_dir), "--resume"]
    line = _one_error_line(runner.invoke(app, args))
    assert "holds a run of 'ka_rmsnorm_h512'" in line, line
    assert _events(run_dir) == before


def test_problem_discovery_follows_symlinked_folders_without_looping(
    example: Path, tmp_path: Path
) -> None:
    real = tmp_path / "elsewhere" / "rmsnorm"
    shutil.copytree(example, real)
    root = tmp_path / "tree"
    (root / "L1").mkdir(parents=True)
    (root / "L1" / "rmsnorm").symlink_to(real, target_is_directory=True)
    (root / "L1" / "loop").symlink_to(root, target_is_directory=True)
    assert find_problems(root) == [root / "L1" / "rmsnorm"]
    result = runner.invoke(app, ["problems", str(root), "--json"])
    assert result.exit_code == 0, result.output
    assert [p["name"] for p in json.loads(result.stdout)] == ["ka_rmsnorm_h512"]


def test_progress_lines_are_short_and_say_whose_incumbent() -> None:
    out = io.StringIO()
    progress = optimize_cmd.Progress(Console(file=out, width=200))
    progress("incumbent", {"agent": "compiler", "candidate": "c0002", "score": 1.2512345678})
    progress("incumbent", {"agent": "precision", "candidate": "c0003", "score": 1.1034567891})
    progress(
        "evaluated",
        {
            "agent": "precision",
            "candidate": "c0003",
            "improved": True,
            "stages": {"full": {"passed": True, "score": 1.1034567891}},
        },
    )
    progress(
        "confirmation",
        {"candidate": "c0004", "of": "c0003", "score": 0.9512345678901234, "reproduced": False},
    )
    text = out.getvalue()
    assert "new incumbent of precision: 1.10× (best overall 1.25×)" in text, text
    assert "c0003 (precision): full passed, 1.10× over eager" in text, text
    assert "score=0.951" in text and "reproduced=False" in text, text
    assert "1.1034567891" not in text and "0.9512345678901234" not in text, text
    assert '"' not in text and "[new incumbent]" not in text, text


def test_messages_name_the_command_as_invoked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert env.prog() in ("kernelarc", os.environ.get(env.PROG_VAR))
    monkeypatch.setenv(env.PROG_VAR, "./ka")

    def broken(run_dir: Path) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(optimize_cmd, "write_report", broken)
    out = io.StringIO()
    optimize_cmd._report(tmp_path, Console(file=out, width=300))
    assert "try `./ka report " in out.getvalue(), out.getvalue()
    monkeypatch.setenv(env.PROG_VAR, " ")
    with pytest.raises(ValueError, match=env.PROG_VAR):
        env.prog()
    assert "KERNELARC_PROG" in (Path(__file__).parents[2] / "ka").read_text()


def test_long_lines_are_not_cut_when_piped(tmp_path: Path) -> None:
    """A long load error on a pipe stays on one line (not wrapped at 80 columns)."""
    folder = tmp_path / ("a_problem_folder_with_a_rather_long_name_" + "x" * 60)
    folder.mkdir()
    (folder / "definition.json").write_text("{ not json")
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    p = subprocess.run(
        [str(KERNELARC), "problems", str(tmp_path)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr
    errors = [x for x in p.stdout.splitlines() if "missing beside definition.json" in x]
    assert errors and str(folder / "workload.jsonl") in errors[0], p.stdout
    assert "…" not in p.stdout, p.stdout
