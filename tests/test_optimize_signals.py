"""Ctrl-C during `kernelarc optimize` stops cleanly: the best so far is written, the run's
status says it was interrupted, and `--resume` continues it to the full budget. SIGTERM
(`timeout`, a batch scheduler) stops it the same way, at once: no confirmation or
composition is judged after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
FAST = ["--device", "cpu", "--full-iterations", "5", "--full-warmup", "1"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelarc.cli.main", *args]


def _as_from_a_terminal() -> None:
    """SIGINT's default in the child, also when this test run was started in the background
    (where a shell starts jobs with SIGINT ignored, and `kernelarc optimize` keeps it so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _seeds(tmp_path: Path) -> list[str]:
    """Two PyTorch solutions of the example as --seed-solution arguments: candidates that
    cost no compile (the run's budget of 3 is the reference and these)."""
    base = json.loads((EXAMPLE / "solution_pytorch.json").read_text())
    args = []
    for i in (1, 2):
        sol = {**base, "name": f"{base['name']}-seed{i}"}
        sol["sources"] = [
            {**src, "content": src["content"] + f"\n# seed {i}\n"} for src in base["sources"]
        ]
        path = tmp_path / f"seed{i}.json"
        path.write_text(json.dumps(sol))
        args += ["--seed-solution", str(path)]
    return args


def _stopped_after_the_first_candidate(
    tmp_path: Path, sig: signal.Signals
) -> tuple[dict[str, Any], list[str]]:
    """Start `kernelarc optimize` (budget 3), send ``sig`` once it has judged its first
    candidate, check it exited cleanly; `kernelarc status --json` of its run, and the
    optimize arguments."""
    run = tmp_path / "run"
    args = ["optimize", str(EXAMPLE), "--agents", "reference", "--budget", "3"]
    args += ["--run-dir", str(run), *_seeds(tmp_path), *FAST]
    proc = subprocess.Popen(
        _cli(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )
    deadline = time.monotonic() + 240
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # wait for the first judged candidate, then signal
        seen.append(line)
        if line.startswith("c0001-") or time.monotonic() > deadline:
            break
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, "".join(seen) + err
    status: dict[str, Any] = json.loads(
        subprocess.run(
            _cli("status", str(run), "--json"), check=True, capture_output=True, text=True
        ).stdout
    )
    assert status["stopped"] == "interrupted"
    assert status["best"] and Path(status["best"]["path"]).exists()
    return status, args


def test_sigint_stops_cleanly_and_resume_finishes(tmp_path: Path) -> None:
    status, args = _stopped_after_the_first_candidate(tmp_path, signal.SIGINT)
    assert 1 <= status["evaluated"] < 3

    done = subprocess.run(_cli(*args, "--resume"), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    status = json.loads(
        subprocess.run(
            _cli("status", str(tmp_path / "run"), "--json"),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert status["evaluated"] >= 3 or status["stopped"] == "every agent is done"
    ids = status["candidate_ids"]
    assert len(ids) == len(set(ids))


def test_sigterm_hands_over_the_best_so_far_at_once(tmp_path: Path) -> None:
    status, _ = _stopped_after_the_first_candidate(tmp_path, signal.SIGTERM)
    assert status["confirmations"] == [] and status["composed"] == []
    events = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    stops = [e for e in map(json.loads, events) if e["kind"] == "interrupted"]
    assert len(stops) == 1 and stops[0]["signal"] == "SIGTERM", stops


def test_memory_file_carries_conclusions_across_runs(tmp_path: Path) -> None:
    memory = tmp_path / "lessons.jsonl"
    for i in (1, 2):
        run = tmp_path / f"run{i}"
        r = subprocess.run(
            _cli(
                "optimize",
                str(EXAMPLE),
                "--agents",
                "reference",
                "--budget",
                "1",
                "--run-dir",
                str(run),
                "--memory",
                str(memory),
                *FAST,
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        lines = memory.read_text().splitlines()
        assert json.loads(lines[0]) == {"kernelarc_memory": 1}
        assert len(lines) - 1 == i  # one lesson per run, the first run's kept
    events = [json.loads(x) for x in (tmp_path / "run2" / "events.jsonl").read_text().splitlines()]
    loaded = [e for e in events if e["kind"] == "memory_loaded"]
    assert loaded and loaded[0]["conclusions"] == 1
