"""FAKE guard and FAKE executor for the orchestrator's logic tests: nothing is built, run
or timed, and no worker process starts.

:class:`FakeGuard` stands where ``kernelarc.guard.evaluator.Guard`` stands (it satisfies
``orchestration.judge.GuardLike``), so the real ``Judge``, ``FinalJudge`` and
``Orchestrator`` run unchanged on it. Each workload's verdict is scripted by the solution's
name: a latency in ms (PASSED, against ``reference_ms``) or a failure status; ``fresh`` gives
other verdicts to judgements in a new process (``fresh_jit``: the confirmation), and
``verdict`` decides for solutions the script does not name (the composition, the
reference). ``seconds_per_workload`` moves the run's clock back by that much for each
workload judged (``attach``), so time limits are tested without waiting.
:class:`InlineExecutor` makes each proposal at once, in the calling thread: the order of the
search is then decided by the orchestrator alone, not by thread timing.

Not covered: anything the guard itself checks (correctness, timing, isolation), and
proposals that run concurrently (``tests/orchestration/test_executor.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernelarc.guard.evaluator import EvalResult
from kernelarc.guard.verdict import WorkloadOutcome
from kernelarc.orchestration.clock import Clock
from kernelarc.orchestration.executor import Executor
from kernelarc.problem.loader import Problem
from kernelarc.problem.schema import EvaluationStatus, Solution, Workload

Verdict = float | str
"""A latency in ms (the workload passed), or the name of a failing ``EvaluationStatus``."""
Script = Verdict | Mapping[str, Verdict]
"""One verdict for every workload, or one per workload uuid (unnamed ones: ``missing``)."""


@dataclass
class Call:
    """One ``evaluate`` call the fake answered."""

    solution: str
    workloads: list[str]
    fresh_jit: bool
    stopped: str | None


class FakeSession:
    """What ``open_session`` returns: it only knows whether it was closed."""

    def __init__(self, solution: Solution) -> None:
        self.solution = solution
        self.closed = False

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeGuard:
    """FAKE guard: scripted per-workload verdicts (module docstring)."""

    problem: Problem
    script: dict[str, Script] = field(default_factory=dict)
    """Solution name → its verdicts."""
    fresh: dict[str, Script] = field(default_factory=dict)
    """Solution name → its verdicts in a new process (``fresh_jit``), when they differ."""
    verdict: Callable[[Solution, Workload], Verdict] | None = None
    """The verdict of a solution the script does not name; without it, such a solution is
    an error of the test."""
    reference_ms: float = 1.0
    seconds_per_workload: float = 0.0
    missing: Verdict = "RUNTIME_ERROR"
    device: str = "cpu"
    calls: list[Call] = field(default_factory=list)
    sessions: list[FakeSession] = field(default_factory=list)
    clock: Clock | None = None

    def attach(self, clock: Clock) -> None:
        """Let each judged workload cost ``seconds_per_workload`` of ``clock``'s time."""
        self.clock = clock

    def open_session(self, solution: Solution) -> FakeSession:
        session = FakeSession(solution)
        self.sessions.append(session)
        return session

    def evaluate(
        self,
        solution: Solution,
        workloads: list[Workload] | None = None,
        *,
        rounds: int | None = None,
        warmup: int | None = None,
        iterations: int | None = None,
        stop: Callable[[WorkloadOutcome], str | None] | None = None,
        session: Any = None,
        retime_reference: bool = False,
        warm_budget_s: float | None = None,
        fresh_jit: bool = False,
    ) -> EvalResult:
        if session is not None and fresh_jit:
            raise ValueError("evaluate(fresh_jit=True) starts its own worker: no session")
        chosen = list(workloads) if workloads is not None else list(self.problem.workloads)
        outcomes: list[WorkloadOutcome] = []
        stopped: str | None = None
        for wl in chosen:
            if self.clock is not None:
                self.clock.started -= self.seconds_per_workload
            outcomes.append(self._outcome(solution, wl, fresh_jit))
            stopped = stop(outcomes[-1]) if stop is not None else None
            if stopped:
                break
        self.calls.append(
            Call(solution.name, [o.workload.uuid for o in outcomes], fresh_jit, stopped)
        )
        return EvalResult(
            stopped_early=stopped,
            solution=solution.name,
            traces=[],
            outcomes=outcomes,
            wall_s=self.seconds_per_workload * len(outcomes),
            phases_s={},
        )

    def _outcome(self, solution: Solution, wl: Workload, fresh_jit: bool) -> WorkloadOutcome:
        scripts = [self.fresh, self.script] if fresh_jit else [self.script]
        script = next((s[solution.name] for s in scripts if solution.name in s), None)
        if script is None:
            if self.verdict is None:
                raise AssertionError(f"FakeGuard has no verdict for {solution.name!r}")
            verdict: Verdict = self.verdict(solution, wl)
        elif isinstance(script, Mapping):
            verdict = script.get(wl.uuid, self.missing)
        else:
            verdict = script
        if isinstance(verdict, str):
            return WorkloadOutcome(
                workload=wl, status=EvaluationStatus(verdict), log=f"{verdict} (scripted)"
            )
        return WorkloadOutcome(
            workload=wl,
            status=EvaluationStatus.PASSED,
            latency={"median_ms": float(verdict)},
            reference={"median_ms": self.reference_ms},
        )

    def judged(self) -> list[str]:
        """The solutions evaluated, in order (one entry per ``evaluate`` call)."""
        return [c.solution for c in self.calls]


class InlineExecutor(Executor):
    """FAKE executor: ``submit`` makes the proposal at once, in the calling thread."""

    def __init__(self) -> None:
        self.closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args))
        except Exception as e:  # the future carries it, as a thread's would
            fut.set_exception(e)
        return fut

    def wait_any(self, futures: Iterable[Future[Any]], timeout: float | None) -> set[Future[Any]]:
        return {f for f in futures if f.done()}

    def shutdown(self) -> None:
        self.closed = True
