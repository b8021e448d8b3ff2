"""The search's time limit inside a judgement (``orchestration/judge.py``), on the CPU.

A real ``Guard`` judges the orchestrator tests' RMSNorm variant of the bundled example
through ``Judge``: with time left, the screening judges every screened workload and the
full protocol follows; with none left, the evaluation stops after the first workload as
"time limit reached" and no full protocol starts. Both stages share one candidate worker.
A candidate crowded out of memory by other processes is judged again once the device has
room (the CPU has no device memory to read: a scripted probe of free memory, named so,
stands in for ``torch.cuda.mem_get_info``; the candidate raises the allocator's message).

Not covered: the orchestrator's wall clock itself (``test_orchestrator.py`` runs without
a time limit; the limit's check between proposals is plain arithmetic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from data.orchestrator.harness import EXAMPLE, GUARD_CONFIG, SOURCE, rms, rms_solution

from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration.config import RunConfig, StageConfig
from kernelarc.orchestration.judge import TIME_LIMIT, Judge
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Solution


@pytest.fixture(scope="module")
def guard() -> Iterator[Guard]:
    with Guard(load_problem(EXAMPLE), GUARD_CONFIG) as g:
        yield g


def judge_with(
    guard: Guard,
    time_left: float,
    full_iterations: int = 3,
    free_bytes: Callable[[], int] | None = None,
) -> Judge:
    config = RunConfig(
        problem=str(EXAMPLE),
        definition=guard.problem.definition.name,
        agents=["a"],
        screen=StageConfig(rounds=1, warmup=1, iterations=3),
        full=StageConfig(rounds=1, warmup=1, iterations=full_iterations),
    )
    return Judge(guard, config, {}, lambda: time_left, free_bytes=free_bytes)


def test_time_left_lets_both_stages_run(guard: Guard) -> None:
    j = judge_with(guard, 1e9)
    guard.reference()
    guard.prepare_spare()
    started = guard._workers  # the reference and the spare the candidate will take
    spawned: list[int] = []
    real_run = j._run

    def counting_run(*args: object, **kwargs: object) -> object:
        spawned.append(guard._workers)  # workers started before each stage
        return real_run(*args, **kwargs)  # type: ignore[arg-type]

    j._run = counting_run  # type: ignore[method-assign]
    stages = j.judge("c1", "a", "s", "refine", rms("tl_ok"), [])
    assert spawned == [started, started], "a spare started between the two stages"
    assert [name for name, _, _ in stages] == ["screen", "full"]
    # One candidate worker for both stages: the full stage neither builds, starts a process
    # nor loads the solution again (its phases report only its own work).
    # The warm spare for the next candidate starts once this one is done with its worker,
    # not between its stages: its start-up would share the cores with the timed calls.
    assert guard._workers == started + 1 and guard._spare is not None
    screen, full = (ev.phases_s for _, ev, _ in stages)
    assert {"build", "process_start", "load"} <= set(screen), screen
    assert not {"build", "process_start", "load"} & set(full), full
    assert full.get("correctness", 0) > 0 and full.get("timing", 0) > 0, full
    screen = stages[0][2]
    assert screen.passed and screen.stopped_early is None
    assert len(screen.per_workload) == len(j.screen_set) > 1


def test_no_time_left_stops_after_one_workload_and_skips_the_full_protocol(
    guard: Guard,
) -> None:
    j = judge_with(guard, -1.0)
    stages = j.judge("c2", "a", "s", "refine", rms("tl_late"), [])
    assert [name for name, _, _ in stages] == ["screen"]
    screen = stages[0][2]
    assert screen.stopped_early == TIME_LIMIT
    assert not screen.passed
    assert len(screen.per_workload) == 1 and screen.per_workload[0].status == "PASSED"


def test_a_held_session_judges_only_its_own_solution(guard: Guard) -> None:
    session = guard.open_session(rms("held_a"))
    try:
        with pytest.raises(ValueError, match="another solution"):
            guard.evaluate(rms("held_b"), session=session)
    finally:
        session.close()


def test_the_reference_is_timed_with_the_candidates_protocol(guard: Guard) -> None:
    """A screening's reference latency comes from the screening's own protocol (warm-up and
    timed calls), not from the full protocol's: the speedup compares like with like (the
    reference judged as a candidate read 0.75-0.89x in screenings on the CPU before, 0.89-1.03x
    after: docs/GUARD.md)."""
    wl = guard.problem.workloads[0]
    quick = guard.evaluate(rms("proto_a"), [wl], rounds=1, warmup=1, iterations=4)
    full = guard.evaluate(rms("proto_a"), [wl], rounds=1)
    (q,), (f,) = quick.outcomes, full.outcomes
    assert q.latency["n"] == q.reference["n"] == 4, (q.latency, q.reference)
    # The full protocol may extend either's timed calls for a tiny kernel (min_timed_ms).
    assert min(f.latency["n"], f.reference["n"]) >= GUARD_CONFIG.iterations, (
        f.latency,
        f.reference,
    )


@pytest.mark.parametrize("retime_full", [False, True])
def test_screenings_retime_the_reference_full_stages_as_the_device_says(
    guard: Guard, retime_full: bool
) -> None:
    """Each screening times the reference again (beside the candidate); the full protocol
    reuses the reference timing cached for the workload and protocol (the GPU's rule), or
    times it again too (the CPU's: ``Judge.retime_full`` is set from the guard's device)."""
    j = judge_with(guard, 1e9, full_iterations=4)  # another protocol than the screening's
    assert j.retime_full, "this guard runs on the CPU"
    j.retime_full = retime_full
    first = j.judge("c8", "a", "s", "refine", rms(f"retime_a{retime_full}"), [])
    second = j.judge("c9", "a", "s", "refine", rms(f"retime_b{retime_full}"), [])
    assert [n for n, _, _ in first] == [n for n, _, _ in second] == ["screen", "full"]
    (_, s1, _), (_, f1, _) = first
    (_, s2, _), (_, f2, _) = second
    pairs = list(zip(s1.outcomes, s2.outcomes, strict=True))
    assert pairs and all(a.reference is not b.reference for a, b in pairs), "screen: retimed"
    pairs = list(zip(f1.outcomes, f2.outcomes, strict=True))
    if retime_full:
        assert pairs and all(a.reference != b.reference for a, b in pairs), "full: retimed"
    else:
        assert pairs and all(a.reference == b.reference for a, b in pairs), "full: the cached one"


CROWDED = (
    "CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 79.18 GiB "
    "of which 4.08 GiB is free. Including non-PyTorch memory, this process has 32.96 GiB "
    "memory in use."
)


def crowded_while(marker: Path, tag: str) -> Solution:
    """An RMSNorm that raises the allocator's crowded message while ``marker`` exists."""
    raise_line = f'raise RuntimeError("variant {tag} fails on purpose")'
    src = SOURCE.format(tag=tag, slow="False", sleep_s=0, fail=f"os.path.exists({str(marker)!r})")
    src = src.replace(raise_line, f"raise RuntimeError({CROWDED!r})").replace(
        "import time\n", "import os\nimport time\n"
    )
    assert CROWDED in src and "import os" in src
    return rms_solution(tag, src)


class ScriptedFreeMemory:
    """A fake probe of the device's free memory (the CPU has none to read): reports
    ``frees`` in turn; when it reports room (50 GiB or more: the candidate's need is
    32.96 + 16 + 1 GiB), the neighbour has gone, so the marker the candidate checks is
    removed."""

    def __init__(self, marker: Path, frees: list[int]) -> None:
        self.marker, self.frees, self.calls = marker, frees, 0

    def __call__(self) -> int:
        free = self.frees[min(self.calls, len(self.frees) - 1)]
        self.calls += 1
        if free >= 50 << 30:
            self.marker.unlink(missing_ok=True)
        return free


def test_a_candidate_crowded_out_is_judged_again_once_the_device_has_room(
    guard: Guard, tmp_path: Path
) -> None:
    marker = tmp_path / "neighbour"
    marker.touch()
    probe = ScriptedFreeMemory(marker, [30 << 30, 60 << 30])
    j = judge_with(guard, 1e9, free_bytes=probe)
    j.crowd_poll_s = 0.01
    stages = j.judge("c10", "a", "s", "refine", crowded_while(marker, "crowd_ok"), [])
    assert [n for n, _, _ in stages] == ["screen (crowded out)", "screen", "full"]
    assert probe.calls == 2
    tried = stages[0][2]
    assert not tried.passed
    log = next(r.log for r in tried.per_workload if r.status != "PASSED")
    assert log.startswith("[crowded out: other processes held 42.1 GiB"), log
    assert "judged again in a fresh worker]" in log and CROWDED in log
    assert stages[1][2].passed and stages[2][2].passed
    assert stages[0][1] is not stages[1][1]


def test_without_room_in_time_the_crowded_verdict_stands_annotated(
    guard: Guard, tmp_path: Path
) -> None:
    marker = tmp_path / "neighbour"
    marker.touch()
    probe = ScriptedFreeMemory(marker, [30 << 30])
    j = judge_with(guard, 0.2, free_bytes=probe)  # a wait of 25% of 0.2 s
    j.crowd_poll_s = 0.01
    stages = j.judge("c11", "a", "s", "refine", crowded_while(marker, "crowd_no"), [])
    assert [n for n, _, _ in stages] == ["screen"] and probe.calls >= 2
    log = next(r.log for r in stages[0][2].per_workload if r.status != "PASSED")
    assert "30.0 GiB free, not the 50.0 GiB needed: the verdict stands]" in log, log


def test_a_candidates_own_failure_is_not_judged_again(guard: Guard, tmp_path: Path) -> None:
    probe = ScriptedFreeMemory(tmp_path / "none", [60 << 30])
    j = judge_with(guard, 1e9, free_bytes=probe)
    stages = j.judge("c12", "a", "s", "refine", rms("own_fail", fail=True), [])
    assert [n for n, _, _ in stages] == ["screen"] and probe.calls == 0
    assert "crowded" not in stages[0][2].per_workload[0].log
