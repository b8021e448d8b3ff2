"""A run with no solution says why (``orchestration/failures.py``): a real run, on the CPU,
of the example problem whose reference fails on one workload (as a reference can run out
of GPU memory on its largest one). The run's stderr and its report name the workload, the
status, the log's first line, and that the reference's own code failed there too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
FAILS = "RuntimeError: out of memory (this test's reference fails on 16 rows)"


def _failing_on_16_rows(tmp_path: Path) -> Path:
    problem = tmp_path / "fails16"
    problem.mkdir()
    (problem / "workload.jsonl").write_text((EXAMPLE / "workload.jsonl").read_text())
    definition = json.loads((EXAMPLE / "definition.json").read_text())
    old = "    eps = 1e-6\n"
    assert old in definition["reference"]
    fail = (
        "    if hidden_states.shape[0] == 16:\n"
        f"        raise RuntimeError({FAILS.split(': ', 1)[1]!r})\n"
    )
    definition["reference"] = definition["reference"].replace(old, fail + old)
    (problem / "definition.json").write_text(json.dumps(definition))
    return problem


def test_a_run_without_solution_names_the_failure_its_candidates_share(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cli = [sys.executable, "-m", "kernelarc.cli.main"]
    opt = subprocess.run(
        [*cli, "optimize", str(_failing_on_16_rows(tmp_path)), "--agents", "reference",
         "--budget", "1", "--device", "cpu", "--full-iterations", "5", "--full-warmup", "1",
         "--run-dir", str(run)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert opt.returncode == 1, opt.stderr  # no solution
    said = opt.stderr.split("no_solution: no candidate passed the full protocol\n", 1)[1]
    assert "(batch_size=16) with RUNTIME_ERROR" in said and FAILS in said, opt.stderr
    report = tmp_path / "report.md"
    subprocess.run([*cli, "report", str(run), "-o", str(report)], check=True, timeout=120)
    text = report.read_text()
    result = text.split("## Result", 1)[1].split("## Trajectory", 1)[0]
    assert "Of the 1 candidates that failed, 1 failed first on workload" in result, result
    assert "(batch_size=16) with RUNTIME_ERROR" in result and FAILS in result, result
    assert "the reference's own code (`c0001-reference`) among them" in result, result
    # the advice works as given: the run without that workload hands a solution over
    (spec,) = re.findall(r"leave it out with `--workloads '(![^']+)'`", result)
    assert spec == "!ka-rms512-b0016-27f9c6d0"
    again = subprocess.run(
        [*cli, "optimize", str(tmp_path / "fails16"), "--agents", "reference",
         "--budget", "1", "--device", "cpu", "--full-iterations", "5", "--full-warmup", "1",
         "--run-dir", str(tmp_path / "again"), "--workloads", spec],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    n = len((EXAMPLE / "workload.jsonl").read_text().strip().splitlines())
    assert f"judging {n - 1} of the problem's {n} workloads" in again.stderr, again.stderr
