"""``benchmarks/split_calls.sh``, the issue-4 benchmark split over device calls: which
problems it skips for want of time, its required settings, and the time it gives each part
(the search, the torch.compile baseline, the SIGTERM before the call's end). CPU only: the
problems here fail at once (no folder, or no time), so only the script's own logic runs;
the benchmark itself is ``test_agents_bench_merge.py``'s and the device's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "benchmarks" / "split_calls.sh"


def test_the_split_runner_skips_what_the_call_has_no_time_for_and_needs_its_folders(
    tmp_path: Path,
) -> None:
    env = {"PATH": "/usr/bin:/bin", "LIMIT": "10", "OUT": str(tmp_path)}
    out = subprocess.run(
        ["bash", str(RUNNER), "007:1:30:200", "L2-025:1:40:100:--workloads+3,8"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # 10 s less what hashing the sources took (a second or two on a loaded machine)
    assert re.search(r"^== 007: skipped, ([89]|10) s left < 200$", out.stdout, re.M), out.stdout
    assert "== L2-025: skipped" in out.stdout and not any(tmp_path.iterdir())
    no_out = subprocess.run(
        ["bash", str(RUNNER), "007:1:30:200"], cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "LIMIT": "10"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert no_out.returncode != 0 and "set OUT" in no_out.stderr
    # MIN_START under the SIGTERM's 45 s is raised to 46: "timeout 0" would never stop it
    low = subprocess.run(
        ["bash", str(RUNNER), "002:1:5:0"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert re.search(r"^== 002: skipped, ([89]|10) s left < 46$", low.stdout, re.M), low.stdout


def test_a_malformed_spec_is_refused_before_anything_runs(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "LIMIT": "10", "OUT": str(tmp_path)}
    for bad in ("L2-002:0:120", "L2-002:0:2m:330", ":0:10:130"):
        out = subprocess.run(
            ["bash", str(RUNNER), "002:0:10:200", bad], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert f"'{bad}' is not ID:COMPILE_SAMPLE:COMPILE_EST:MIN_START" in out.stderr
        assert "== 002" not in out.stdout  # the good spec before it did not start


def test_the_split_runner_ends_the_baseline_before_its_sigterm(tmp_path: Path) -> None:
    """The compile baseline gets its whole estimate before the SIGTERM: session 42 started
    L2 025's 110 s baseline with 105 s to the SIGTERM and lost it. Here the problem folder
    does not exist, so the problem fails at once; the arithmetic is in the line before."""
    env = {"PATH": "/usr/bin:/bin", "LIMIT": "300", "OUT": str(tmp_path / "out")}
    env["PROBLEMS"] = str(tmp_path / "none")
    out = subprocess.run(
        ["bash", str(RUNNER), "L2-025:0:100:10"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    m = re.search(r"^== L2-025: (\d+) s left, deadline (\d+), SIGTERM at (\d+)$", out.stdout, re.M)
    assert m, out.stdout
    left, deadline, term = map(int, m.groups())
    assert 290 <= left <= 300 and term == left - 45
    assert deadline + 100 + 5 == term  # baseline budget and a margin fit before the SIGTERM
    assert re.search(r"^== L2-025: rc [1-9]\d* in \d+ s$", out.stdout, re.M), out.stdout
