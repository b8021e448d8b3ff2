"""``benchmarks/fused_ab.sh``: the same judgement with and without the guard's fused
comparison pass, in one call.

Covered: the script runs end to end on the CPU (the bundled example, one workload, one
round): both sides judge the reference and it passes, the torch-only copy is what its
``import kernelarc`` finds, and each side's probe JSON lands in ``OUT``; a missing problem
folder is named in the error; a probe that fails fails the script. Not covered: the GPU,
where only the fused side takes the fused pass (on the CPU both sides take the torch paths,
so nothing here compares them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fused_ab.sh"
EXAMPLE = ROOT / "src" / "kernelarc" / "examples" / "rmsnorm_h512"


def _env(**extra: str) -> dict[str, str]:
    # the script calls `python3`: the one running these tests
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/tmp", **extra}


def test_both_sides_judge_the_reference_and_keep_their_json(tmp_path: Path) -> None:
    p = subprocess.run(
        ["bash", str(SCRIPT), str(EXAMPLE), "--workloads", "1", "--rounds", "1",
         "--device", "cpu"],
        cwd=ROOT, env=_env(LIMIT="240", OUT=str(tmp_path)), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("PASSED") == 2 and p.stdout.count("rc 0 in") == 2, p.stdout
    for side in ("fused", "torch"):
        d = json.loads((tmp_path / f"{side}.json").read_text())
        assert [w["status"] for w in d["workloads"]] == ["PASSED"]
        assert "round.compare" in d["phases_s"][-1]


def test_a_missing_problem_folder_is_named(tmp_path: Path) -> None:
    p = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "nope")], cwd=ROOT, env=_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and f"no problem folder {tmp_path / 'nope'}" in p.stderr


def test_a_failing_probe_fails_the_script(tmp_path: Path) -> None:
    p = subprocess.run(
        ["bash", str(SCRIPT), str(EXAMPLE), "--no-such-option"], cwd=ROOT,
        env=_env(OUT=str(tmp_path)), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.count("rc 2 in") == 2 and "unrecognized arguments" in p.stdout
