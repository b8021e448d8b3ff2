"""Ctrl-C during `kernelarc optimize` stops cleanly: the best so far is written, the run's
status says it was interrupted, and `--resume` continues it to the full budget. SIGTERM
(`timeout`, a batch scheduler) stops it the same way, at once: no confirmation or
composition is judged after it; one that comes during the confirmation abandons it and the
search's best is handed over. Each test's runs are its own; they run at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
FAST = ["--device", "cpu", "--full-iterations", "5", "--full-warmup", "1"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelarc.cli.main", *args]


def _as_from_a_terminal(cmd: list[str]) -> list[str]:
    """``cmd`` with SIGINT's default, also when this test run was started in the background
    (where a shell starts jobs with SIGINT ignored, and `kernelarc optimize` keeps it so): a
    small Python process sets it, then becomes ``cmd`` (``exec``, the same process id). Not
    ``preexec_fn``, which is unsafe where threads run (these runs start from threads)."""
    reset = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    reset += "os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", reset, *cmd]


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
        _as_from_a_terminal(_cli(*args)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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


def _slowed_example(tmp_path: Path) -> Path:
    """The example problem with a reference that does its work, then 200 more passes over
    the input: any plain solution of it is far faster, so the run's choice is not the
    reference and is confirmed at the end."""
    problem = tmp_path / "slowed"
    problem.mkdir()
    for f in ("definition.json", "workload.jsonl"):
        (problem / f).write_text((EXAMPLE / f).read_text())
    definition = json.loads((problem / "definition.json").read_text())
    old = "    x = hidden_states.to(torch.float32)\n"
    assert old in definition["reference"]
    waste = "    for _ in range(200):\n        x = x * 1.0\n"
    definition["reference"] = definition["reference"].replace(old, old + waste)
    (problem / "definition.json").write_text(json.dumps(definition))
    return problem


def _stopped_during_the_confirmation(tmp_path: Path) -> tuple[int, str, Path]:
    """Optimize the slowed example with its reference and one seed, a plain solution, and
    send SIGTERM when the search has stopped. The seed wins every workload, so no composition
    is judged; the signal waits for the next judgement, the confirmation of the seed (in a
    new worker that first imports torch). It used to land in the composition's planning
    when the reference passed too (CI of ``bdebc51``): that planning was cut as well.
    Exit status, stderr, run directory."""
    run = tmp_path / "run"
    args = ["optimize", str(_slowed_example(tmp_path)), "--agents", "reference"]
    args += ["--budget", "2", "--run-dir", str(run), *FAST]
    args += ["--seed-solution", str(EXAMPLE / "solution_pytorch.json")]
    proc = subprocess.Popen(
        _as_from_a_terminal(_cli(*args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("search_stopped"):
            os.kill(proc.pid, signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=240)
    return proc.returncode, "".join(seen) + err, run


def _interrupted_then_resumed(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stopped by SIGINT, then ``--resume``: the status after each."""
    status, args = _stopped_after_the_first_candidate(tmp_path, signal.SIGINT)
    done = subprocess.run(_cli(*args, "--resume"), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    finished = json.loads(
        subprocess.run(
            _cli("status", str(tmp_path / "run"), "--json"),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    return status, finished


def _two_runs_with_one_memory(tmp_path: Path) -> tuple[list[str], Path]:
    """Two runs with the same ``--memory`` file: its text after each run; the folder of the
    runs (``run1``, ``run2``)."""
    memory = tmp_path / "lessons.jsonl"
    seen = []
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
        seen.append(memory.read_text())
    return seen, tmp_path


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """Each test's runs (its own run directories), started together (``_shared``'s
    ``started_ahead``): the tests check what they left; none of their claims is a timing."""
    jobs: dict[str, Callable[[], Any]] = {
        "test_sigint_stops_cleanly_and_resume_finishes": partial(
            _interrupted_then_resumed, tmp_path_factory.mktemp("sigint")
        ),
        "test_sigterm_hands_over_the_best_so_far_at_once": partial(
            _stopped_after_the_first_candidate, tmp_path_factory.mktemp("sigterm"), signal.SIGTERM
        ),
        "test_sigterm_during_the_confirmation_hands_over_the_search_best": partial(
            _stopped_during_the_confirmation, tmp_path_factory.mktemp("confirming")
        ),
        "test_memory_file_carries_conclusions_across_runs": partial(
            _two_runs_with_one_memory, tmp_path_factory.mktemp("memory")
        ),
    }
    yield from started_ahead(request, jobs)


def test_sigint_stops_cleanly_and_resume_finishes(runs: dict[str, Future[Any]]) -> None:
    status, finished = runs["test_sigint_stops_cleanly_and_resume_finishes"].result()
    assert 1 <= status["evaluated"] < 3
    assert finished["evaluated"] >= 3 or finished["stopped"] == "every agent is done"
    ids = finished["candidate_ids"]
    assert len(ids) == len(set(ids))


def test_sigterm_hands_over_the_best_so_far_at_once(runs: dict[str, Future[Any]]) -> None:
    status, args = runs["test_sigterm_hands_over_the_best_so_far_at_once"].result()
    assert status["confirmations"] == [] and status["composed"] == []
    run_dir = Path(args[args.index("--run-dir") + 1])
    events = (run_dir / "events.jsonl").read_text().splitlines()
    stops = [e for e in map(json.loads, events) if e["kind"] == "interrupted"]
    assert len(stops) == 1 and stops[0]["signal"] == "SIGTERM", stops


def test_sigterm_during_the_confirmation_hands_over_the_search_best(
    runs: dict[str, Future[Any]],
) -> None:
    rc, err, run = runs["test_sigterm_during_the_confirmation_hands_over_the_search_best"].result()
    assert rc == 0, err
    assert "search_stopped" in err and "confirmation" not in err.split("search_stopped")[0]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    stops = [e for e in events if e["kind"] == "interrupted"]
    assert [(e["during"], e["signal"]) for e in stops] == [("confirmation", "SIGTERM")], err
    status = json.loads(
        subprocess.run(
            _cli("status", str(run), "--json"), check=True, capture_output=True, text=True
        ).stdout
    )
    assert status["confirmations"] == []  # abandoned, not recorded
    best = status["best"]
    assert best and Path(best["path"]).exists() and best["all_passed"] and not best["is_reference"]
    handed = json.loads(Path(best["path"]).read_text())
    assert (
        handed["sources"] == json.loads((EXAMPLE / "solution_pytorch.json").read_text())["sources"]
    )


def test_memory_file_carries_conclusions_across_runs(runs: dict[str, Future[Any]]) -> None:
    memory, tmp_path = runs["test_memory_file_carries_conclusions_across_runs"].result()
    for i, text in enumerate(memory, start=1):
        lines = text.splitlines()
        assert json.loads(lines[0]) == {"kernelarc_memory": 1}
        assert len(lines) - 1 == i  # one lesson per run, the first run's kept
    events = [json.loads(x) for x in (tmp_path / "run2" / "events.jsonl").read_text().splitlines()]
    loaded = [e for e in events if e["kind"] == "memory_loaded"]
    assert loaded and loaded[0]["conclusions"] == 1
