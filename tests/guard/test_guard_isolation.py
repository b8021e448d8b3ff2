"""The guard's process isolation, end to end: the real ``kernelarc eval`` in a subprocess on
the bundled example ``rmsnorm_h512`` (CPU, workloads 0 and 1), plus the Python API.

Covered: a worker that segfaults or ends itself with ``os._exit(3)`` on workload 0 gives
RUNTIME_ERROR there and the next workload is judged in a fresh worker (PASSED); one that
hangs on workload 0 gives TIMEOUT there and the next workload is not run (TIMEOUT, ``not
run:``); the ``-o`` traces of those runs are schema-valid with the right fields; after the
CLI exits no worker process of the run is left (found through a marker variable in
``/proc/*/environ``); secret-looking variables of the caller never reach the candidate
while ``PATH`` does; a connection attempt is REWARD_HACK[network] and every trace log names
the isolation level (when ``unshare --net`` works here); ``Guard.evaluate`` on two solutions
keeps one reference worker (and its cached reference timings) and never reuses the worker
of a candidate that failed.

Not covered: GPU crashes (illegal memory access), OOM kills, PID-namespace views of the
parent's ``/proc`` (see ``tests/corpus``). The CLI runs after the hang test's start together.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import check_trace_lines, started_ahead, write_solution

from kernelarc.env import parent_environment
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Solution, Trace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
DATA = Path(__file__).resolve().parents[1] / "data"
FAST = ("--device", "cpu", "--workloads", "0,1", "--warmup", "1", "--iterations", "3")
UUIDS = [w.uuid for w in load_problem(EXAMPLE).workloads[:2]]
MARKER_VAR = "KA_TEST_MARKER"
SECRETS = {
    "OPENAI_API_KEY": "sk-ka-test-openai",
    "ANTHROPIC_API_KEY": "sk-ka-test-anthropic",
    "MY_SECRET_TOKEN": "ka-test-token-value",
    "DB_PASSWORD": "ka-test-db-password",
}


# ---------------------------------------------------------------- helpers


@dataclass
class CliRun:
    rc: int
    stdout: str
    stderr: str
    trace_lines: list[str]
    wall_s: float
    leftover: list[str]  # worker processes of this run still alive after it exited

    def describe(self) -> str:
        return f"rc={self.rc}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"


def worker_processes(marker: str) -> list[str]:
    """Guard worker processes (any user-visible ones) whose environment carries the marker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # another user's process, or one that just ended: not ours
            continue
        if needle in environ.split(b"\0") and b"kernelarc.guard.worker" in cmdline:
            args = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {args}")
    return found


def leftover_workers(marker: str, grace_s: float = 5.0) -> list[str]:
    """Worker processes still there after ``grace_s`` (time to be reaped after a kill)."""
    deadline = time.monotonic() + grace_s
    while (found := worker_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def run_eval(
    args: list[str], *, out: Path, env_extra: dict[str, str] | None = None, timeout: float = 180
) -> CliRun:
    marker = uuid.uuid4().hex
    env = {k: v for k, v in parent_environment().items() if k not in ("COLUMNS", "LINES")}
    env.update({MARKER_VAR: marker, **(env_extra or {})})
    cmd = [sys.executable, "-m", "kernelarc.cli.main", "eval", *args, "-o", str(out)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    lines = out.read_text().splitlines() if out.exists() else []
    return CliRun(p.returncode, p.stdout, p.stderr, lines, wall, leftover_workers(marker))


def judge(
    tmp: Path,
    data_file: str,
    *extra: str,
    replace: dict[str, str] | None = None,
    env_extra: dict[str, str] | None = None,
) -> CliRun:
    source = (DATA / data_file).read_text()
    for key, value in (replace or {}).items():
        source = source.replace(key, value)
    sol = write_solution(tmp / "sol", source, Path(data_file).stem)
    return run_eval(
        [str(EXAMPLE), "--solution", str(sol), *FAST, *extra],
        out=tmp / "traces.jsonl",
        env_extra=env_extra,
    )


def check_traces(run: CliRun, statuses: list[str]) -> list[Trace]:
    """The -o traces, checked against the expected status per workload."""
    return check_trace_lines(run.trace_lines, UUIDS, statuses, run.describe())


def log_of(trace: Trace) -> str:
    assert trace.evaluation is not None
    return trace.evaluation.log


# ---------------------------------------------------------------- crash survival


def test_hang_on_first_workload_is_timeout_then_next_is_not_run(tmp_path: Path) -> None:
    """First in this module, before ``runs`` starts the other CLI runs, on a machine left to
    it: the hang costs one 5 s limit, and the next workload is reported, not judged."""
    run = judge(tmp_path, "hang_first.py", "--timeout", "5")
    assert run.rc == 1, run.describe()
    hung, skipped = check_traces(run, ["TIMEOUT", "TIMEOUT"])
    assert "time limit of 5 s" in log_of(hung), log_of(hung)
    assert log_of(skipped).startswith(f"not run: an earlier workload timed out ({UUIDS[0]})")
    assert run.wall_s < 60, f"the 1000 s sleep was not cut short: {run.wall_s:.0f} s"
    assert run.leftover == []


def _unshare_net_works() -> bool:
    try:
        return (
            subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=20).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


UNSHARE_NET = _unshare_net_works()


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """The CLI runs of the tests below, each in a folder of its own, started together
    (``_shared``'s ``started_ahead``): none of their claims is a timing."""
    tmp = tmp_path_factory.mktemp
    jobs: dict[str, Callable[[], Any]] = {
        "test_segfault_on_first_workload_then_a_fresh_worker_passes": partial(
            judge, tmp("segfault"), "segfault_first.py"
        ),
        "test_raise_and_os_exit_are_runtime_errors": partial(
            judge, tmp("raise"), "raise_then_exit.py"
        ),
        "test_secrets_do_not_reach_the_candidate": partial(_dump_env, tmp("env")),
    }
    if UNSHARE_NET:
        network = "test_network_connection_is_reward_hack_and_log_names_isolation"
        jobs[network] = partial(judge, tmp("net"), "network_connect.py")
    yield from started_ahead(request, jobs)


def test_segfault_on_first_workload_then_a_fresh_worker_passes(
    runs: dict[str, Future[Any]],
) -> None:
    run = runs["test_segfault_on_first_workload_then_a_fresh_worker_passes"].result()
    assert run.rc == 1, run.describe()
    crashed, passed = check_traces(run, ["RUNTIME_ERROR", "PASSED"])
    assert "SIGSEGV" in log_of(crashed), log_of(crashed)
    assert passed.evaluation is not None and passed.evaluation.performance is not None
    assert "Traceback" not in run.stderr, run.describe()
    assert run.leftover == []


def test_raise_and_os_exit_are_runtime_errors(runs: dict[str, Future[Any]]) -> None:
    run = runs["test_raise_and_os_exit_are_runtime_errors"].result()
    assert run.rc == 1, run.describe()
    raised, exited = check_traces(run, ["RUNTIME_ERROR", "RUNTIME_ERROR"])
    assert "ka-test deliberate failure" in log_of(raised), log_of(raised)
    assert "exited with code 3" in log_of(exited), log_of(exited)
    assert "Traceback" not in run.stderr, run.describe()
    assert run.leftover == []


# ---------------------------------------------------------------- secrets, network


def _dump_env(tmp_path: Path) -> tuple[CliRun, Path]:
    """env_dump.py judged with secret-looking variables set; the file it wrote."""
    dump = tmp_path / "env.json"
    return judge(tmp_path, "env_dump.py", replace={"@OUT@": str(dump)}, env_extra=SECRETS), dump


def test_secrets_do_not_reach_the_candidate(runs: dict[str, Future[Any]]) -> None:
    run, dump = runs["test_secrets_do_not_reach_the_candidate"].result()
    check_traces(run, ["PASSED", "PASSED"])
    seen = json.loads(dump.read_text())
    assert "PATH" in seen["names"]
    assert sorted(set(SECRETS) & set(seen["names"])) == []
    assert sorted(set(SECRETS.values()) & set(seen["values"])) == []
    assert run.leftover == []


@pytest.mark.skipif(not UNSHARE_NET, reason="unshare --net is not permitted here")
def test_network_connection_is_reward_hack_and_log_names_isolation(
    runs: dict[str, Future[Any]],
) -> None:
    from kernelarc.guard.isolation import probe_isolation

    run = runs["test_network_connection_is_reward_hack_and_log_names_isolation"].result()
    assert run.rc == 1, run.describe()
    level = probe_isolation().description
    assert "network" in level, level
    for trace in check_traces(run, ["REWARD_HACK", "REWARD_HACK"]):
        assert log_of(trace).startswith("REWARD_HACK[network]: "), log_of(trace)
        assert f"isolation: {level}" in log_of(trace).splitlines(), log_of(trace)
    assert f"isolation: {level}" in " ".join(run.stderr.split())


# ---------------------------------------------------------------- Python API


def _call_log_solution(tag: str) -> Solution:
    source = (DATA / "call_log.py").read_text().replace("@TAG@", tag)
    return Solution.model_validate(
        {
            "name": f"call_log_{tag}",
            "definition": "ka_rmsnorm_h512",
            "author": "kernelarc-tests",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "s.py::run",
                "destination_passing_style": True,
            },
            "sources": [{"path": "s.py", "content": source}],
        }
    )


def _calls_per_log(guard_tmp: Path) -> dict[str, set[str]]:
    """For each candidate worker's log file, the ``KA-CALL`` lines it holds."""
    return {
        p.name: {
            ln for ln in p.read_text(errors="replace").splitlines() if ln.startswith("KA-CALL ")
        }
        for p in sorted(guard_tmp.glob("candidate-*.log"))
    }


def test_guard_reuses_the_reference_worker_but_not_a_failed_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelarc.guard.evaluator import Guard, GuardConfig

    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER_VAR, marker)  # inherited by the workers the Guard starts
    problem = load_problem(EXAMPLE)
    workloads = list(problem.workloads[:2])
    config = GuardConfig(device="cpu", warmup=1, iterations=3, cache_dir=tmp_path / "cache")
    with Guard(problem, config) as guard:
        first = guard.evaluate(_call_log_solution("fail"), workloads)
        assert [t.evaluation.status.value for t in first.traces if t.evaluation] == [
            "RUNTIME_ERROR",
            "PASSED",
        ], first.traces
        ref = guard._ref
        assert ref is not None and ref.alive() and ref.proc is not None
        ref_pid = ref.proc.pid
        second = guard.evaluate(_call_log_solution("ok"), workloads)
        assert [t.evaluation.status.value for t in second.traces if t.evaluation] == [
            "PASSED",
            "PASSED",
        ], second.traces
        assert guard._ref is ref and ref.alive() and ref.proc.pid == ref_pid
        # workload 1's reference was timed once, for the first solution, and reused
        assert second.outcomes[1].reference == first.outcomes[1].reference
        calls = _calls_per_log(guard.tmp)
        running = worker_processes(marker)
    assert running, "no worker process carried the marker while the guard was open"
    assert leftover_workers(marker) == []

    def logs_with(line: str) -> list[str]:
        return [name for name, lines in calls.items() if line in lines]

    failed = logs_with("KA-CALL fail batch=1")
    assert len(failed) == 1, calls
    assert calls[failed[0]] == {"KA-CALL fail batch=1"}, calls  # not reused for workload 1
    assert logs_with("KA-CALL fail batch=3") and failed[0] not in logs_with(
        "KA-CALL fail batch=3"
    ), calls
    # the second solution ran in worker(s) that never hosted the first one
    for name in logs_with("KA-CALL ok batch=1") + logs_with("KA-CALL ok batch=3"):
        assert all(ln.startswith("KA-CALL ok ") for ln in calls[name]), calls
    # a candidate that passes keeps its worker from one workload to the next
    assert logs_with("KA-CALL ok batch=1") == logs_with("KA-CALL ok batch=3"), calls


def test_the_reference_worker_compiles_with_caches_of_its_own(tmp_path: Path) -> None:
    """The reference worker (where the torch.compile baseline compiles) gets Inductor and
    Triton caches and a TMPDIR (where torch keeps more Inductor caches) that no candidate
    worker is pointed at, outside the guard's scratch tree, removed when the guard closes;
    candidates share the configured cache. No worker builds Inductor's precompiled C++
    headers (kept under TMPDIR: rebuilt by every guard, 7.5 s of a warm 8 s compile)."""
    from kernelarc.guard.evaluator import Guard, GuardConfig

    problem = load_problem(EXAMPLE)
    config = GuardConfig(device="cpu", warmup=1, iterations=3, cache_dir=tmp_path / "cache")
    with Guard(problem, config) as guard:
        ref_env, cand_env = guard._env("reference"), guard._env("candidate")
        private = guard._ref_cache
        assert private.is_dir()
        for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            assert Path(ref_env[key]).parent == private, ref_env[key]
            assert Path(cand_env[key]).parent == (tmp_path / "cache").resolve()
            assert not Path(ref_env[key]).is_relative_to(guard.tmp)
        assert Path(ref_env["TMPDIR"]).parent == private
        assert Path(cand_env["TMPDIR"]).is_relative_to(guard.tmp)
        for env in (ref_env, cand_env):
            assert env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
        started = guard._ref_started or guard._ref
        assert started is not None and started.proc is not None
        environ = Path(f"/proc/{started.proc.pid}/environ").read_bytes().split(b"\0")
        expected = f"TORCHINDUCTOR_CACHE_DIR={private / 'inductor'}".encode()
        assert expected in environ
    assert not private.exists()
