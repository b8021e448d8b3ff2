"""Budget-aware, deterministic use of the guard in the search.

Every new candidate gets the same two stages:

1. **Screening**: a fixed, shape-spread subset of workloads (the smallest, the median and
   the largest by input size, then evenly spread ones; chosen once per run), judged with a
   lighter protocol (``RunConfig.screen``). After the first screened workload the
   evaluation stops early when the candidate is ``hopeless_factor`` times slower there
   than the best incumbent.
2. **Full protocol** on every workload (``RunConfig.full``) for any candidate whose
   screening passed and whose screened score is within reach of an incumbent (at least
   the worst incumbent's screened score on the same workloads, or there is none yet), or
   which is a *shape winner*: faster than every incumbent by over ``SHAPE_WIN`` on at least
   one screened workload (slower overall, it can still win those shapes in the final
   shape-gated composition, which uses full results only).

Both stages of one candidate run in the same candidate worker (``Guard.open_session``): the
full stage does not build, load or compile the solution again (a torch.compile candidate's
screened shapes, and its dynamic-shape graph once compiled, are reused). A duplicate (same
content hash as a judged candidate) gets the cached verdict and costs no budget. The final
solution always gets the full protocol on every workload.

A judgement that fails because *other* processes crowded the device out of memory (the
allocator's figures say the failed allocation would have fit in what they held:
``crowding.py``) is judged once more in a fresh worker when the device has room again
within a bounded wait; both attempts are recorded, the first as ``"screen (crowded out)"``.

Under a time limit (``time_left``), an evaluation in progress when it runs out stops after
the workload being judged ("time limit reached": the candidate does not pass that stage) and
no full protocol starts after it: a run overshoots its limit by at most one workload's
judgement, not by a whole candidate's (a workload in progress is not interrupted).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kernelarc.agents.types import CandidateResult, Mode, WorkloadResult
from kernelarc.guard.evaluator import EvalResult
from kernelarc.guard.verdict import WorkloadOutcome
from kernelarc.maths import geomean
from kernelarc.orchestration.config import RunConfig, StageConfig
from kernelarc.orchestration.crowding import (
    CROWD_WAIT_S,
    CROWD_WAIT_SHARE,
    POLL_S,
    OutOfMemory,
    crowded_out,
    device_free_bytes,
    wait_for_room,
)
from kernelarc.problem.inputs import estimate_input_bytes
from kernelarc.problem.loader import Problem
from kernelarc.problem.reference import reference_solution
from kernelarc.problem.schema import EvaluationStatus, Solution, Workload


class Session(Protocol):
    """A candidate worker kept between evaluations of one solution (``Guard.open_session``)."""

    def close(self) -> None: ...


class GuardLike(Protocol):
    """What the search needs of the benchmark guard: the real
    :class:`~kernelarc.guard.evaluator.Guard`, or a scripted stand-in that judges without
    worker processes (the orchestration tests' ``FakeGuard``)."""

    device: str
    problem: Problem

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
    ) -> EvalResult: ...

    def open_session(self, solution: Solution) -> Any: ...


#: The most of the time left a reference point's full stage may take (``Judge._affordable``).
REFERENCE_POINT_SHARE = 0.5


def full_cost_estimate(
    screen_s: float, n_workloads: int, n_screened: int, once_s: float = 0.0
) -> float:
    """Seconds a full evaluation should take, from one complete screening: each workload as
    long as a screened one. Not scaled up by the full protocol's larger rounds and call
    counts: a screening also pays each shape's first-call costs (cuBLAS heuristics, a
    candidate's own warm-up, the reference's first computations), which the full stage does
    not pay again (scaling by the rounds' ratio overestimates several times over:
    docs/PERFORMANCE.md). A candidate that compiles at run time screens mostly compiling, in
    its correctness phase: ``once_s`` is the part of the screening counted once, not per
    workload (:func:`compile_once_s`)."""
    once = min(max(once_s, 0.0), screen_s)
    return once + (screen_s - once) * n_workloads / max(n_screened, 1)


def compile_once_s(solution: Solution, phases_s: dict[str, float]) -> float:
    """The part of a screening :func:`full_cost_estimate` counts once: for a solution that
    compiles at run time, its correctness phase (the first calls of each screened shape,
    where it compiles), else nothing: after the first shapes, compiling the others in the
    same worker costs a few seconds each, not a screening's worth (the estimate's accuracy
    on GPUs: docs/PERFORMANCE.md)."""
    return float(phases_s.get("correctness", 0.0)) if solution.compiles_at_run_time() else 0.0


def screening_set(workloads: Sequence[Workload], sizes: Sequence[int], k: int) -> list[Workload]:
    """A fixed subset spread over input size: smallest, median, largest, then even spread."""
    order = sorted(range(len(workloads)), key=lambda i: (sizes[i], workloads[i].uuid))
    if k >= len(order):
        return [workloads[i] for i in order]
    picks: list[int] = []
    for frac in [0.0, 0.5, 1.0] + [j / (k + 1) for j in range(1, k + 1)]:
        idx = order[round(frac * (len(order) - 1))]
        if idx not in picks:
            picks.append(idx)
        if len(picks) == k:
            break
    return [workloads[i] for i in picks]


def results_of(
    outcomes: Sequence[WorkloadOutcome], bounds: dict[str, float]
) -> tuple[WorkloadResult, ...]:
    return tuple(
        WorkloadResult(
            uuid=o.workload.uuid,
            axes=dict(o.workload.axes),
            status=o.status.value,
            check=o.check,
            latency_ms=o.latency_ms,
            reference_ms=o.reference_ms,
            bound_ms=bounds.get(o.workload.uuid),
            log=o.log[:2000],
        )
        for o in outcomes
    )


def score_of(per_workload: Sequence[WorkloadResult]) -> float | None:
    if not per_workload or any(r.status != "PASSED" for r in per_workload):
        return None
    return geomean([r.speedup or 0.0 for r in per_workload])


def significant(
    new: Sequence[WorkloadResult], old: Sequence[WorkloadResult] | None, min_gain: float
) -> bool:
    """Whether ``new`` beats ``old`` (same workloads): the geomean speedup of new over old
    must exceed ``1 + min_gain``. Per workload that is the ratio of their speedups over the
    reference timed with each, or of their latencies where a side lacks one. On a GPU both
    carry the same cached reference timing and the two agree; where the reference is timed
    again with each candidate (the CPU, whose timings drift within a run) the ratio of
    speedups cancels the drift and agrees with ``score_of``, which picks the run's best.
    (The guard's interleaved ``Guard.compare`` is the stricter tool for close calls.)"""
    new_score = score_of(new)
    if new_score is None:
        return False
    if not old:
        return True
    theirs = {r.uuid: r for r in old if r.latency_ms}
    ratios = [_gain(r, theirs[r.uuid]) for r in new if r.latency_ms and r.uuid in theirs]
    g = geomean(ratios)
    return g is not None and g > 1.0 + min_gain


def beats_reference(per_workload: Sequence[WorkloadResult], min_gain: float) -> bool:
    """Whether a full judgement is significantly faster than the reference: it passed, and
    its geometric-mean speedup over the reference timed with it (``score_of``) exceeds
    ``1 + min_gain`` (the rule of :func:`significant`, against the reference itself)."""
    score = score_of(per_workload)
    return score is not None and score > 1.0 + min_gain


def _gain(new: WorkloadResult, old: WorkloadResult) -> float:
    """How many times faster ``new`` is than ``old`` on one workload (both timed)."""
    if new.speedup and old.speedup:
        return new.speedup / old.speedup
    if not (new.latency_ms and old.latency_ms):
        raise ValueError(f"workload {new.uuid}: a gain needs both sides timed")
    return old.latency_ms / new.latency_ms


def reference_broken(
    per_workload: Sequence[WorkloadResult], n_screened: int, itself: bool = False
) -> str | None:
    """The first line of the reference's own error when a screening found it failing on
    every one of the ``n_screened`` screened workloads: the guard's reference failed
    (``INVALID_REFERENCE``), or, ``itself``, the screened solution is the reference's own
    code and failed (a screening goes on past such failures: ``Judge._run``); None
    otherwise. Then no candidate can be verified, whatever it is. Not covered: a reference
    that fails only on workloads outside the screened ones (``failures.common_failure``
    names those), or one found broken only by candidates built on it (they fail first, in
    the candidate's worker: the reference's own candidate then tells)."""
    failed = {EvaluationStatus.INVALID_REFERENCE.value}
    bad = [r for r in per_workload if r.status in failed or (itself and r.status != "PASSED")]
    if not per_workload or len(bad) < n_screened or len(bad) != len(per_workload):
        return None
    lines = [line.strip() for line in bad[0].log.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "the reference failed")[:300]


#: Margin by which a candidate must beat every incumbent on one screened workload to be a
#: shape winner (well above the run-to-run spread of screening latencies).
SHAPE_WIN = 1.10


def shape_winner(
    new: Sequence[WorkloadResult], incumbents: Sequence[Sequence[WorkloadResult]]
) -> bool:
    """Whether ``new`` beats the fastest incumbent by over ``SHAPE_WIN`` on some workload
    that every incumbent was measured on."""
    for r in new:
        theirs = [i.latency_ms or 0.0 for inc in incumbents for i in inc if i.uuid == r.uuid]
        if r.latency_ms and theirs and len(theirs) == len(incumbents) and all(theirs):
            if r.latency_ms * SHAPE_WIN < min(theirs):
                return True
    return False


#: ``stopped_early`` of an evaluation cut short by the run's time limit.
TIME_LIMIT = "time limit reached"


class Judge:
    """Stages a candidate through the guard; the orchestrator calls it serially."""

    def __init__(
        self,
        guard: GuardLike,
        config: RunConfig,
        bounds: dict[str, float],
        time_left: Callable[[], float] | None = None,
        free_bytes: Callable[[], int] | None = None,
    ) -> None:
        self.guard, self.config, self.bounds = guard, config, bounds
        self.time_left = time_left
        wls = list(guard.problem.workloads)
        sizes = [estimate_input_bytes(guard.problem.definition, w) for w in wls]
        self.screen_set = screening_set(wls, sizes, config.screen_workloads)
        self.all = wls
        self.reference_hash = reference_solution(
            guard.problem.definition, agent="reference", description=""
        ).content_hash()
        """The content hash of the problem's reference as a solution: a candidate with it
        is the reference's own code, screened past its failures (``reference_broken``)."""
        self.retime_full = guard.device == "cpu"
        """Whether full stages time the reference again too (screenings always do). On the
        CPU, yes: timings there drift within a run (docs/GUARD.md) and re-timing is cheap; on
        a GPU the cached timing stands (a re-timing costs tens of seconds on large
        workloads)."""
        cuda = guard.device.startswith("cuda")
        self.free_bytes = free_bytes or (device_free_bytes(guard.device) if cuda else None)
        """The device's free memory, read here: the wait after a crowded-out failure."""
        self.crowd_poll_s = POLL_S

    def _run(
        self,
        solution: Solution,
        workloads: list[Workload],
        stage: StageConfig,
        best_first: float | None,
        session: Session,
        retime_reference: bool = False,
        screening: bool = False,
    ) -> EvalResult:
        factor = self.config.hopeless_factor
        itself = solution.content_hash() == self.reference_hash

        def stop(o: WorkloadOutcome) -> str | None:
            if self.out_of_time():
                return TIME_LIMIT
            if screening and (itself or o.status is EvaluationStatus.INVALID_REFERENCE):
                return None  # the reference's own failure: screen on, to tell a broken one
            if o.status.value != "PASSED":
                return f"{o.status.value} on workload {o.workload.uuid}"
            if (
                best_first
                and o.latency_ms
                and o is not None
                and o.workload.uuid == workloads[0].uuid
                and o.latency_ms > factor * best_first
            ):
                return (
                    f"hopeless: {o.latency_ms:.4g} ms on the first screened workload, "
                    f"over {factor:g}x the best incumbent's {best_first:.4g} ms"
                )
            return None

        return self.guard.evaluate(
            solution,
            workloads,
            rounds=stage.rounds,
            warmup=stage.warmup,
            iterations=stage.iterations,
            stop=stop,
            session=session,
            retime_reference=retime_reference,
            warm_budget_s=self.time_left() if self.time_left is not None else None,
        )

    def judge(
        self,
        candidate_id: str,
        agent: str,
        strategy: str,
        mode: Mode,
        solution: Solution,
        incumbents_screen: Sequence[Sequence[WorkloadResult]],
        always_full: bool = False,
    ) -> list[tuple[str, EvalResult, CandidateResult]]:
        """Screen, then (if promising, or ``always_full``: a reference point users compare
        with, when it fits the time left) the full protocol. Returns one entry per stage
        run."""
        first = self.screen_set[0].uuid
        best_first = min(
            (
                r.latency_ms
                for inc in incumbents_screen
                for r in inc
                if r.uuid == first and r.latency_ms
            ),
            default=None,
        )

        def result(
            stage: str, per: tuple[WorkloadResult, ...], stopped: str | None
        ) -> CandidateResult:
            return self._result(candidate_id, agent, strategy, mode, stage, per, stopped)

        args = (solution, incumbents_screen, best_first, always_full, result)
        stages = self._stages(*args)
        oom = self._crowded(stages)
        if oom is None:
            return stages
        budget = CROWD_WAIT_S
        if self.time_left is not None:
            budget = min(budget, CROWD_WAIT_SHARE * max(0.0, self.time_left()))
        assert self.free_bytes is not None
        room, waited, free = wait_for_room(
            oom.need, self.free_bytes, budget, poll_s=self.crowd_poll_s
        )
        gib = 1 << 30
        note = (
            f"[crowded out: {oom.describe()}; after {waited:.0f} s the device had "
            f"{free / gib:.1f} GiB free"
        )
        if not room or self.out_of_time():
            why = "not the" if not room else "but no time was left for"
            note += f", {why} {oom.need / gib:.1f} GiB needed: the verdict stands]"
            return [(name, ev, _annotated(res, note)) for name, ev, res in stages]
        note += ": judged again in a fresh worker]"
        tried = [(f"{name} (crowded out)", ev, _annotated(res, note)) for name, ev, res in stages]
        return tried + self._stages(*args)

    def _crowded(self, stages: list[tuple[str, EvalResult, CandidateResult]]) -> OutOfMemory | None:
        """The crowded out-of-memory failure that decided this judgement, if any."""
        if self.free_bytes is None:
            return None
        last = stages[-1][2]
        return crowded_out([r.log for r in last.per_workload if r.status != "PASSED"])

    def _stages(
        self,
        solution: Solution,
        incumbents_screen: Sequence[Sequence[WorkloadResult]],
        best_first: float | None,
        always_full: bool,
        result: Callable[[str, tuple[WorkloadResult, ...], str | None], CandidateResult],
    ) -> list[tuple[str, EvalResult, CandidateResult]]:
        """One attempt at judging ``solution``: its stages; ``result`` makes a stage's
        :class:`CandidateResult` from (stage, per-workload results, why it stopped)."""
        # One candidate worker for both stages (closed whatever happens).
        with contextlib.closing(self.guard.open_session(solution)) as session:
            # Screenings decide which candidates go on: each is compared with a reference
            # timed beside it, not minutes earlier (cheap: a few workloads, 3 + 10 calls).
            res = self._run(
                solution,
                self.screen_set,
                self.config.screen,
                best_first,
                session,
                retime_reference=True,
                screening=True,
            )
            per = results_of(res.outcomes, self.bounds)
            screened = result("screen", per, res.stopped_early)
            stages = [("screen", res, screened)]
            if (
                screened.passed
                and not self.out_of_time()
                and len(per) == len(self.screen_set)
                and (
                    (
                        always_full
                        and self._affordable(res.wall_s, compile_once_s(solution, res.phases_s))
                    )
                    or self._promising(screened, incumbents_screen)
                )
            ):
                full = self._run(
                    solution, self.all, self.config.full, None, session, self.retime_full
                )
                per_full = results_of(full.outcomes, self.bounds)
                stages.append(("full", full, result("full", per_full, full.stopped_early)))
            return stages

    def _affordable(self, screen_s: float, once_s: float = 0.0) -> bool:
        """A reference point's full stage, by :func:`full_cost_estimate` from its screening
        (``once_s`` of it counted once), fits in :data:`REFERENCE_POINT_SHARE` of the time
        left (always, without a limit): it is judged for the report, not to win, so it must
        not crowd out the search. A compiled baseline's compile time is counted once
        (``once_s``), not once per workload."""
        if self.time_left is None:
            return True
        est = full_cost_estimate(screen_s, len(self.all), len(self.screen_set), once_s)
        return est <= REFERENCE_POINT_SHARE * self.time_left()

    def out_of_time(self) -> bool:
        return self.time_left is not None and self.time_left() <= 0

    def _promising(
        self, screened: CandidateResult, incumbents_screen: Sequence[Sequence[WorkloadResult]]
    ) -> bool:
        scores = [s for s in (score_of(inc) for inc in incumbents_screen) if s is not None]
        if not scores or (screened.score or 0.0) >= min(scores):
            return True
        return shape_winner(screened.per_workload, incumbents_screen)

    def _result(
        self,
        cid: str,
        agent: str,
        strategy: str,
        mode: Mode,
        stage: str,
        per: tuple[WorkloadResult, ...],
        stopped: str | None,
    ) -> CandidateResult:
        passed = bool(per) and all(r.status == "PASSED" for r in per)
        return CandidateResult(
            candidate_id=cid,
            agent=agent,
            strategy=strategy,
            mode=mode,
            stage="full" if stage == "full" else "screen",
            per_workload=per,
            passed=passed and stopped is None,
            score=score_of(per) if passed else None,
            stopped_early=stopped,
        )


def _annotated(result: CandidateResult, note: str) -> CandidateResult:
    """``result`` with ``note`` added to each failed workload's log (what agents and the
    report read)."""
    per = tuple(
        r if r.status == "PASSED" else r.model_copy(update={"log": f"{note} {r.log}"})
        for r in result.per_workload
    )
    return result.model_copy(update={"per_workload": per})


def summarize_stages(stages: Sequence[tuple[str, EvalResult, CandidateResult]]) -> dict[str, Any]:
    return {
        name: {
            "passed": r.passed,
            "score": r.score,
            "stopped": r.stopped_early,
            "wall_s": round(ev.wall_s, 2),
            # Where the stage's time went (worker start, build, compile pass, correctness,
            # timing, re-check, reference timing): what limits a search under a time limit.
            "phases_s": {k: round(v, 2) for k, v in ev.phases_s.items()},
        }
        for name, ev, r in stages
    }
