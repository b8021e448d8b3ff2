"""``benchmarks/split_calls.sh``, the issue-4 benchmark split over device calls: which
problems it skips for want of time, its required settings, and the time it gives each part
(the search, the torch.compile baseline, the SIGTERM before the call's end). CPU only: the
problems here fail at once (no folder, or no time), so only the script's own logic runs;
the benchmark itself is ``test_agents_bench_merge.py``'s and the device's. Also
``benchmarks/issue4_calls.sh``, the steps of the six problems over device calls, in its
``PLAN_ONLY`` mode (the commands it would run) and its refusals."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


PLAN = ROOT / "benchmarks" / "issue4_calls.sh"


def _plan(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "PLAN_ONLY": "1"}
    return subprocess.run(
        ["bash", str(PLAN), *args], cwd=ROOT, env={**base, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_issue4_steps_hand_split_calls_their_problems_and_the_time_left(
    tmp_path: Path,
) -> None:
    """Each step's problems and limits (``PLAN_ONLY`` prints the command): the limit counts
    from T0, the start of the device command, so the setup before it is taken off."""
    wanted = {
        "1": (588, ["L2-025:0:110:300:--workloads+3,8+--cupti+off"]),
        "2": (430, ["L2-002:0:120:330"]),
        "3": (590, ["L1-017:0:100:240", "Q-001:0:15:200"]),
        "4": (595, ["002:0:10:130", "007:0:10:170"]),
    }
    for step, (limit, specs) in wanted.items():
        out = _plan(tmp_path, step)
        assert out.returncode == 0, out.stderr
        m = re.search(r"^\+ env OUT=(\S+) LIMIT=(\d+) bash benchmarks/split_calls.sh (.*)$",
                      out.stdout, re.M)  # fmt: skip
        assert m, out.stdout
        assert m.group(1) == f"{tmp_path}/b" and m.group(3).split() == specs
        assert limit - 5 <= int(m.group(2)) <= limit
    started = subprocess.run(["date", "+%s"], capture_output=True, text=True).stdout.strip()
    late = _plan(tmp_path, "2", T0=str(int(started) - 100), LIMIT="400")
    m = re.search(r"LIMIT=(\d+)", late.stdout)
    assert m and 295 <= int(m.group(1)) <= 300, late.stdout
    assert not any(tmp_path.iterdir())  # nothing ran


def test_an_issue4_bad_step_is_refused_by_name(tmp_path: Path) -> None:
    for bad in ("", "5", "finish", "finish-h200"):  # the finish steps were removed (session 45)
        out = _plan(tmp_path, *([bad] if bad else []))
        assert out.returncode == 2 and f"not '{bad}'" in out.stderr
    no_out = subprocess.run(
        ["bash", str(PLAN), "1"], cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert no_out.returncode != 0 and "set OUT" in no_out.stderr
