"""The guard's scratch folders: owner files, and the sweep of folders whose owner is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelarc.guard.scratch import OWNER_FILE, make_scratch, owner_line, sweep_stale

pytestmark = pytest.mark.skipif(not Path("/proc/self/ns/pid").exists(), reason="needs /proc")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_folder_names_its_owner(tmp_path: Path) -> None:
    d = make_scratch("ka-test-", tmp_path)
    assert d.parent == tmp_path and d.name.startswith("ka-test-")
    pid, start, ns = (d / OWNER_FILE).read_text().split()
    assert int(pid) == os.getpid()
    assert (pid, start, ns) == tuple(owner_line().split())  # type: ignore[union-attr]


def test_the_sweep_removes_only_folders_whose_owner_is_gone(tmp_path: Path) -> None:
    mine = make_scratch("ka-test-", tmp_path)
    dead = make_scratch("ka-test-", tmp_path)
    line = owner_line()
    assert line is not None
    _, start, ns = line.split()
    (dead / OWNER_FILE).write_text(f"{_dead_pid()} {start} {ns}\n")
    (dead / "left.bin").write_bytes(b"x" * 100)
    # Our own process id, but another start time: the id was reused, the owner is gone.
    reused = make_scratch("ka-test-", tmp_path)
    (reused / OWNER_FILE).write_text(f"{os.getpid()} 1 {ns}\n")
    # A process of another PID namespace: its ids mean nothing here, never judged gone.
    foreign = make_scratch("ka-test-", tmp_path)
    (foreign / OWNER_FILE).write_text(f"{_dead_pid()} {start} pid:[1]\n")
    unowned = tmp_path / "ka-test-old"  # made by an older version: whose it is is unknown
    unowned.mkdir()
    garbled = make_scratch("ka-test-", tmp_path)
    (garbled / OWNER_FILE).write_text("not an owner line\n")
    other_prefix = make_scratch("ka-else-", tmp_path)
    (other_prefix / OWNER_FILE).write_text(f"{_dead_pid()} {start} {ns}\n")

    removed = sweep_stale("ka-test-", tmp_path)

    assert sorted(removed) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    for kept in (mine, foreign, unowned, garbled, other_prefix):
        assert kept.is_dir(), kept


def test_a_killed_guard_s_folders_are_swept_by_the_next_guard(tmp_path: Path) -> None:
    """A process that made scratch folders and was SIGKILLed leaves them; the next sweep
    (what a new Guard runs first) removes them."""
    code = (
        "import sys, os, signal; from kernelarc.guard.scratch import make_scratch;"
        "d = make_scratch('ka-test-', sys.argv[1]); print(d, flush=True);"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == -9
    left = Path(proc.stdout.strip())
    assert left.is_dir() and (left / OWNER_FILE).is_file()
    assert sweep_stale("ka-test-", tmp_path) == [left]
    assert not left.exists()


def test_a_missing_base_sweeps_nothing(tmp_path: Path) -> None:
    assert sweep_stale("ka-test-", tmp_path / "absent") == []


def test_a_guard_sweeps_stale_folders_and_owns_its_own() -> None:
    from kernelarc.guard.evaluator import Guard, GuardConfig
    from kernelarc.problem.loader import load_problem

    example = Path(__file__).resolve().parents[2] / "src/kernelarc/examples/rmsnorm_h512"
    line = owner_line()
    assert line is not None
    _, start, ns = line.split()
    stale = make_scratch("kernelarc-refcache-")
    (stale / OWNER_FILE).write_text(f"{_dead_pid()} {start} {ns}\n")
    with Guard(load_problem(example), GuardConfig(device="cpu")) as guard:
        assert not stale.exists()
        own = [guard.tmp, guard._ref_cache]
        for d in own:
            assert (d / OWNER_FILE).read_text().split()[0] == str(os.getpid())
        swept = sweep_stale("kernelarc-guard-", guard.tmp.parent)
        swept += sweep_stale("kernelarc-refcache-")
        for d in own:  # their owner is alive: kept
            assert d not in swept and d.is_dir()
    assert not any(d.exists() for d in own)
