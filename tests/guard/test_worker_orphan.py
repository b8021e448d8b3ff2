"""A guard worker does not outlive its parent: `kernelarc eval` killed (SIGKILL, as by the
OOM killer or a job's time limit) while its candidate worker runs a 120 s call; every
worker it started must be gone within seconds, not after the call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"

SLEEPER = """
import time
def run(hidden_states, weight, output):
    time.sleep(120)
"""


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _descendants(pid: int) -> set[int]:
    kids, found, todo = _children(), set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in found:
                found.add(k)
                todo.append(k)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _is_worker(pid: int) -> bool:
    try:
        return b"kernelarc.guard.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_workers_end_with_a_killed_parent(tmp_path: Path) -> None:
    sol = json.loads((EXAMPLE / "solution_pytorch.json").read_text())
    sol["name"] = "sleeper"
    sol["sources"] = [{"path": "s.py", "content": SLEEPER}]
    sol["spec"] = {**sol["spec"], "entry_point": "s.py::run", "destination_passing_style": True}
    path = tmp_path / "sleeper.json"
    path.write_text(json.dumps(sol))
    cmd = [sys.executable, "-m", "kernelarc.cli.main", "eval", str(EXAMPLE), "--solution"]
    cmd += [str(path), "--device", "cpu", "--timeout", "300", "--workloads", "0"]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    everything: set[int] = set()
    try:
        workers: set[int] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # both workers up, the candidate in its call
            workers = {p for p in _descendants(parent.pid) if _is_worker(p)}
            if len(workers) >= 2:
                break
            time.sleep(0.5)
        assert len(workers) >= 2, f"workers never started: {workers}"
        time.sleep(8)  # the reference's outputs, then the candidate's sleeping call
        assert parent.poll() is None, "eval ended early: the call did not sleep"
        everything = _descendants(parent.pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        gone_by = time.monotonic() + 15
        while time.monotonic() < gone_by and any(_alive(p) for p in everything):
            time.sleep(0.2)
        left = sorted(p for p in everything if _alive(p))
        assert not left, f"processes outlived their parent: {left}"
    finally:  # nothing left behind, whatever failed
        for p in everything | (_descendants(parent.pid) if parent.poll() is None else set()):
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
