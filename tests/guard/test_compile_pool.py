"""The guard's compile pass with Inductor's compile pool (``guard/compile_pool.py``), on the
CPU with the bundled ``rmsnorm_h512`` example (Inductor compiles C++ there, through the
same pool).

Covered: a torch.compile solution judged with ``compile_workers=2`` passes, its notes name
the pass, the phase is timed, and nothing of the pool is left when judging starts (no
``threads``/``subprocess`` finding); a solution that uses the pool during the pass to leave
a process behind is REWARD_HACK[subprocess]; without a runtime compile, or with
``compile_workers`` 0, no pass runs; no call starts past the budget. Not covered: the GPU
(Triton kernels compiled in the pool), timings of the pass (benchmarks, PERFORMANCE.md).
Each test's guard is its own (a fresh cache: a cold compile); they judge at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead

from kernelarc.examples import example_dir
from kernelarc.guard.evaluator import EvalResult, Guard, GuardConfig
from kernelarc.guard.isolation import probe_isolation
from kernelarc.guard.session import MIN_PASS_S
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.reference import make_solution
from kernelarc.problem.schema import Solution
from kernelarc.proposers.compiler import COMPILE_VARIANTS, compiled_source

pytestmark = pytest.mark.skipif(
    "pid" not in probe_isolation().description, reason="the compile pass needs a PID namespace"
)

EVIL_TAIL = """

def kernelarc_evil(*args):
    # Only while the guard's compile pool is up: a job that leaves a process behind.
    import functools
    import os

    try:
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads

        if get_compile_threads() > 1:
            fut = AsyncCompile.process_pool().submit(
                functools.partial(os.system, "sleep 120 > /dev/null 2>&1 &")
            )
            fut.result(timeout=60)
    except Exception:
        pass
    return kernelarc_entry(*args)
"""


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


def _compiled(problem: Problem, evil: bool = False) -> Solution:
    source = compiled_source(problem.definition.reference, COMPILE_VARIANTS[0])
    return make_solution(
        problem.definition,
        agent="tests",
        name="compiled-evil" if evil else "compiled",
        description="torch.compile of the reference",
        source=source + (EVIL_TAIL if evil else ""),
        entry="kernelarc_evil" if evil else "kernelarc_entry",
    )


def _config(tmp_path: Path, workers: int) -> GuardConfig:
    return GuardConfig(
        device="cpu",
        warmup=1,
        iterations=3,
        rounds=2,
        compile_workers=workers,
        cache_dir=tmp_path / "cache",
    )


def _twice_in_a_session(problem: Problem, tmp_path: Path) -> tuple[EvalResult, EvalResult]:
    solution = _compiled(problem)
    with Guard(problem, _config(tmp_path, 2)) as guard:
        session = guard.open_session(solution)
        try:
            first = guard.evaluate(solution, list(problem.workloads[:1]), session=session)
            second = guard.evaluate(solution, list(problem.workloads[:2]), session=session)
        finally:
            session.close()
    return first, second


def _once(
    problem: Problem, tmp_path: Path, sol: Solution, workers: int, budget: float | None
) -> EvalResult:
    """``sol`` judged on the first workload by a fresh guard (``warm_budget_s=budget``)."""
    with Guard(problem, _config(tmp_path, workers)) as guard:
        return guard.evaluate(sol, list(problem.workloads[:1]), warm_budget_s=budget)


@pytest.fixture(scope="module")
def judged(
    request: pytest.FixtureRequest, problem: Problem, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """Each test's judgements (a fresh guard and cache each), started together (``_shared``'s
    ``started_ahead``): the tests below check them, and none of their claims is a timing."""
    plain = load_solution(example_dir("rmsnorm_h512") / "solution_pytorch.json")
    compiled, evil = _compiled(problem), _compiled(problem, evil=True)
    tiny = MIN_PASS_S - 1  # a budget too small for a pass (no note where none applies)
    no_pass = "test_no_pass_without_a_runtime_compile_or_workers"
    jobs: dict[str, Callable[[], Any]] = {
        name: partial(job, problem, tmp_path_factory.mktemp("pool"), *args)
        for name, job, args in [
            ("test_a_compiled_solution_passes_after_compile_passes", _twice_in_a_session, ()),
            ("test_a_process_left_by_a_pool_job_is_a_reward_hack", _once, (evil, 2, None)),
            (f"{no_pass}[no runtime compile]", _once, (plain, 2, tiny)),
            (f"{no_pass}[no workers]", _once, (compiled, 0, tiny)),
            ("test_no_pass_starts_on_a_budget_smaller_than_the_pools_start", _once,
             (compiled, 2, tiny)),
        ]
    }  # fmt: skip
    yield from started_ahead(request, jobs)


def test_a_compiled_solution_passes_after_compile_passes(judged: dict[str, Future[Any]]) -> None:
    """Two evaluations in one session (the search's screening, then its full stage): the
    second pass starts the pool again and covers only the workload not yet called."""
    first, second = judged["test_a_compiled_solution_passes_after_compile_passes"].result()
    for res, n in ((first, 1), (second, 2)):
        statuses = [t.evaluation.status.value for t in res.traces if t.evaluation]
        assert statuses == ["PASSED"] * n, [o.log for o in res.outcomes]
        assert res.phases_s.get("compile_pass", 0.0) > 0, res.phases_s
    for res in (first, second):  # each pass called one workload
        notes = res.outcomes[-1].notes
        assert any("compile pass: 1 workload(s) called once with 2 Inductor" in n for n in notes)


def test_a_process_left_by_a_pool_job_is_a_reward_hack(judged: dict[str, Future[Any]]) -> None:
    res = judged["test_a_process_left_by_a_pool_job_is_a_reward_hack"].result()
    outcome = res.outcomes[0]
    assert outcome.status.value == "REWARD_HACK", outcome.log
    assert "REWARD_HACK[subprocess]" in (outcome.log or ""), outcome.log
    assert "processes left after the compile pass" in (outcome.log or ""), outcome.log
    assert "sleep 120" in (outcome.log or ""), outcome.log


@pytest.mark.parametrize("case", ["no runtime compile", "no workers"])
def test_no_pass_without_a_runtime_compile_or_workers(
    judged: dict[str, Future[Any]], case: str
) -> None:
    """Without a runtime compile (the plain solution, 2 workers) or without workers (the
    compiled one, ``compile_workers`` 0), under a budget too small for a pass: no pass and
    no note of one."""
    res = judged[f"test_no_pass_without_a_runtime_compile_or_workers[{case}]"].result()
    assert res.outcomes[0].status.value == "PASSED", res.outcomes[0].log
    assert not any("compile pass" in n for n in res.outcomes[0].notes)
    assert "compile_pass" not in res.phases_s
    # The trace says what compiling cost (Dynamo's counters; only where it compiled).
    extra = res.traces[0].evaluation.performance.extra
    if case == "no workers":
        stats = extra["torch_compile"]
        assert stats["graphs"] >= 1 and stats["compile_s"] > 0, stats
        assert set(stats) == {"graphs", "compile_s", "inductor_s", "kernel_wait_s"}
    else:
        assert "torch_compile" not in extra, extra


def test_no_pass_starts_on_a_budget_smaller_than_the_pools_start(
    judged: dict[str, Future[Any]],
) -> None:
    """A budget under MIN_PASS_S (the pool's start alone would spend it): no pool, a note
    says why, and the solution is judged (and compiled) as usual."""
    tiny = judged["test_no_pass_starts_on_a_budget_smaller_than_the_pools_start"].result()
    assert tiny.outcomes[0].status.value == "PASSED", tiny.outcomes[0].log
    notes = tiny.outcomes[0].notes
    assert any("compile pass skipped: 19.0 s left" in n for n in notes), notes
    assert "compile_pass" not in tiny.phases_s
