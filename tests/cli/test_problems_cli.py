"""Tests of ``kernelarc problems``: table and JSON output, exit codes 0/1/2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _shared import shared_problems_root
from typer.testing import CliRunner

from kernelarc.cli.main import app

runner = CliRunner()
DEFINITION = {
    "name": "toy_scale",
    "axes": {
        "n": {"type": "var"},
        "d": {"type": "const", "value": 8},
        "half": {"type": "expr", "expression": "n / 2"},
    },
    "inputs": {"x": {"shape": ["n", "d"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["half", "d"], "dtype": "float32"}},
    "reference": "def run(x):\n    return x[: x.shape[0] // 2]\n",
}


def workload_line(uuid: str, n: int = 4) -> str:
    return json.dumps({"uuid": uuid, "axes": {"n": n}, "inputs": {"x": {"type": "random"}}})


def write_problem(directory: Path, lines: list[str] | None = None) -> None:
    directory.mkdir(parents=True)
    (directory / "definition.json").write_text(json.dumps(DEFINITION))
    lines = lines or [workload_line(f"u{i}", n=2 * (i + 1)) for i in range(3)]
    (directory / "workload.jsonl").write_text("\n".join(lines) + "\n")


def make_tree(root: Path, broken: bool) -> Path:
    write_problem(root / "L1" / "good_one")
    write_problem(root / "mine" / "good_two", [workload_line("w0"), workload_line("w1", n=8)])
    if broken:
        write_problem(root / "L2" / "bad", [workload_line("w0"), '{"uuid": "w1", "axes": {}}'])
    return root


def test_json_lists_every_problem_with_error_field(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree", broken=True)
    result = runner.invoke(app, ["problems", str(root), "--json"])
    assert result.exit_code == 1, result.output
    rows = json.loads(result.stdout)  # stdout is the JSON list and nothing else
    by_path = {Path(r["path"]).name: r for r in rows}
    assert sorted(by_path) == ["bad", "good_one", "good_two"]
    assert by_path["good_one"]["error"] is None
    assert by_path["good_one"]["subset"] == "L1" and by_path["good_one"]["workloads"] == 3
    assert by_path["good_two"]["subset"] is None and by_path["good_two"]["workloads"] == 2
    assert by_path["good_two"]["axes"] == {"n": "var", "d": "const=8", "half": "expr: n / 2"}
    assert "workload.jsonl:2 (field axes)" in by_path["bad"]["error"]
    assert "3 problems, 1 failed" in result.stderr


def test_table_and_exit_zero_when_all_load(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree", broken=False)
    result = runner.invoke(app, ["problems", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert result.stdout.count("toy_scale") == 2
    assert "2 problems (5 workloads), 0 failed" in result.stdout


def test_table_lists_failures(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "tree", broken=True)
    result = runner.invoke(app, ["problems", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "var axis 'n' has no value" in result.stdout
    assert "3 problems (5 workloads), 1 failed" in result.stdout


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    wide = {"COLUMNS": "300"}  # the error box must not wrap the message
    result = runner.invoke(app, ["problems", str(tmp_path / "missing")], env=wide)
    assert result.exit_code == 2
    assert "does not exist" in result.stderr and result.stdout == ""
    result = runner.invoke(app, ["problems", str(tmp_path), "--json"], env=wide)
    assert result.exit_code == 2
    assert "no problem found" in result.stderr and result.stdout == ""
    assert runner.invoke(app, ["problems"]).exit_code == 2


def test_subprocess_json_over_shared_problems() -> None:
    root = shared_problems_root()
    proc = subprocess.run(
        [sys.executable, "-m", "kernelarc.cli.main", "problems", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == len(list(root.glob("**/definition.json")))
    assert all(r["error"] is None and r["workloads"] > 0 for r in rows)
    assert {r["subset"] for r in rows} <= {"L1", "L2", "Quant", "FlashInfer-Bench"}
