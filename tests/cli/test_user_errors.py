"""Every command prints a KernelArcError as one ``error:`` line on stderr, exit code 2, and
the errors a user can act on are KernelArcErrors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kernelarc.cli.main import USAGE_ERROR, app
from kernelarc.errors import (
    InputGenerationError,
    KernelArcError,
    MissingBlobError,
    ProblemLoadError,
)
from kernelarc.problem.emulation import EmulationError
from kernelarc.problem.expressions import AxisError
from kernelarc.problem.lowbit import LowBitError
from kernelarc.roofline.profiles import UnknownDeviceError
from kernelarc.roofline.score import SolUnavailableError
from kernelarc.store.base import StoreError
from kernelarc.store.sqlite import SQLiteStore

MESSAGE = "the run directory is damaged: start a new run"
runner = CliRunner()


def _fail(*_: Any, **__: Any) -> Any:
    raise KernelArcError(MESSAGE)


#: command -> (what raises, its arguments); the patched name is where the command looks it up.
CASES: dict[str, tuple[str, list[str]]] = {
    "eval": ("kernelarc.cli.eval_cmd.load_problem", ["-s", "solution.json"]),
    "problems": ("kernelarc.cli.problems_cmd.find_problems", []),
    "sol": ("kernelarc.cli.sol_cmd.load_problem", []),
    "optimize": ("kernelarc.cli.optimize_cmd.load_problem", []),
    "status": ("kernelarc.cli.status_cmd.SQLiteStore", []),
    "report": ("kernelarc.cli.report_cmd.write_report", []),
    "agents": ("kernelarc.cli.agents_cmd.describe", []),
    "check-problems": ("kernelarc.cli.check_cmd.find_problems", []),
}


def test_every_command_is_checked() -> None:
    assert {c.name for c in app.registered_commands} == set(CASES)


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_kernelarc_error_is_one_line_and_exit_code_2(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, extra = CASES[command]
    monkeypatch.setattr(target, _fail)
    (tmp_path / "store.sqlite").touch()  # `status` opens it only when it is there
    args = [command] if command == "agents" else [command, str(tmp_path), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == USAGE_ERROR == 2, result.output
    assert result.stderr == f"error: {MESSAGE}\n"
    assert "Traceback" not in result.output


def test_a_store_error_during_a_run_is_reported_not_raised(
    example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    SQLiteStore(tmp_path / "store.sqlite").close()

    def damaged(self: SQLiteStore, config: dict[str, Any]) -> dict[str, Any]:
        raise StoreError(f"{self.path}: reading the store failed (disk I/O error)")

    monkeypatch.setattr(SQLiteStore, "open_run", damaged)
    args = ["optimize", str(example), "--run-dir", str(tmp_path), "--resume", "--device", "cpu"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and "disk I/O error" in result.stderr
    assert not isinstance(result.exception, StoreError)


def test_sol_names_an_unknown_device_as_an_error(example: Path) -> None:
    result = runner.invoke(app, ["sol", str(example), "--device", "a100"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "a100" in result.stderr


@pytest.mark.parametrize(
    "error",
    [
        AxisError,
        EmulationError,
        InputGenerationError,
        LowBitError,
        MissingBlobError,
        ProblemLoadError,
        SolUnavailableError,
        StoreError,
        UnknownDeviceError,
    ],
)
def test_errors_a_user_acts_on_are_kernelarc_errors(error: type[Exception]) -> None:
    assert issubclass(error, KernelArcError)
