"""The last judgement of a run: does the chosen solution reproduce its speed in a new process?

The search judges every candidate with the user's Triton and Inductor caches, so a speed
that came from a run-time draw is measured once and then served from the cache. Inductor's
``max-autotune`` benchmarks its kernel configurations when a process first calls them and
keeps the pick in its cache; on microsecond kernels the pick is close to random, so a
solution the search measured fast can be several times slower in the user's process
(measurements: docs/PERFORMANCE.md, ``benchmarks/repro_probe.py``).

So before a run hands its solution over (``finish``), the chosen candidate is judged once more
with the full protocol on every workload, in a new candidate worker whose Triton and Inductor
caches start empty (``Guard.evaluate(fresh_jit=True)``), as the user's process will start.
It *reproduced* when that judgement passed, its latencies' geometric mean is at most
``GEOMEAN_SLOWER`` slower than the search's, and no workload is more than ``WORST_SLOWER``
times slower. When it did not, the next candidates by search score are confirmed the same
way (``TRIES`` in all, time permitting), until one reproduces; the run then hands over, of
all confirmations that passed, the one with the best score, with the traces of that
confirmation (not the search's). Each confirmation is a finisher's candidate
(``CONFIRMER``, its parent the confirmed candidate): it costs no budget.

Not covered: a draw that is lucky twice (in the search and again here: one new process per
candidate, not a distribution of them); what differs on the user's machine (another GPU,
driver or library version); a solution that is slow only in a process that has already
called it many times.

Under a time limit the search keeps time for the first confirmation
(``schedule.reserve``, ``FRESH_SLOWER`` times the candidate's search judging time) only
when the board's best solution can draw at run time (:func:`draws_at_run_time`: it compiles
or autotunes when first called); a solution that cannot gets the confirmation only when time
is left after the search. With less time left than the candidate's judgement took, the
confirmation is skipped with an event and the search's measurement is handed over. Why not
always keep the time: a reserve for a slow eager solution can cut the full stage of a
better candidate built on it, for a confirmation that then may not fit anyway.
"""

from __future__ import annotations

from functools import partial

from kernelarc.agents.types import Conclusion, Outcome, WorkloadResult
from kernelarc.maths import geomean
from kernelarc.orchestration.clock import Clock
from kernelarc.orchestration.events import Events
from kernelarc.orchestration.final import FinalJudge, Pass
from kernelarc.orchestration.judge import TIME_LIMIT
from kernelarc.orchestration.state import RunState
from kernelarc.problem.schema import RUNTIME_COMPILE_MARKERS, Solution
from kernelarc.store.base import CandidateRecord, EvaluationRecord

CONFIRMER = "confirmation"
GEOMEAN_SLOWER = 0.15
"""Largest slowdown of the geometric mean over workloads that still counts as reproduced:
the same solution of microsecond kernels reads this much apart in two new processes."""
WORST_SLOWER = 1.5
"""Largest slowdown of any one workload that still counts as reproduced."""
TRIES = 3
"""Candidates confirmed at most: the chosen one and two runners-up."""
FRESH_SLOWER = 1.5
"""How many times the search's judging time of a candidate the time limit keeps for its
confirmation (``schedule.reserve``). A new worker with empty JIT caches compiles and loads
again, so a confirmation takes longer than the search's judgement of the same candidate
(measured: docs/PERFORMANCE.md); with 1x kept, most confirmations were skipped for lack of
time. A confirmation still starts whenever its candidate's search judging time fits what
is left."""

DRAW_MARKERS = (*RUNTIME_COMPILE_MARKERS, "autotune")
"""Text in a Python source that makes its speed a run-time draw: Inductor's compiles (and
its ``max-autotune`` picks), Triton's ``@triton.autotune``. A Triton kernel with fixed
launch parameters, a CUDA C++ build or a static TunableOp table compiles the same way in
every process."""


def draws_at_run_time(solution: Solution) -> bool:
    """Whether ``solution``'s speed may differ between new processes because it compiles or
    autotunes when first called (a textual test on its ``.py`` sources: a scheduling
    estimate, not a security check)."""
    return any(
        m in s.content for s in solution.sources if s.path.endswith(".py") for m in DRAW_MARKERS
    )


def slowdown(
    search: tuple[WorkloadResult, ...], fresh: tuple[WorkloadResult, ...]
) -> tuple[float, float] | None:
    """(geometric-mean, worst) ratio fresh latency / search latency over the workloads both
    measured, or None when they share none."""
    old = {r.uuid: r.latency_ms for r in search if r.latency_ms}
    ratios = [r.latency_ms / old[r.uuid] for r in fresh if r.latency_ms and r.uuid in old]
    mean = geomean(ratios)
    return None if mean is None else (mean, max(ratios))


def reproduced(search: EvaluationRecord, fresh: EvaluationRecord) -> bool:
    """Whether ``fresh`` (a confirmation) reproduces ``search`` (the search's full stage)."""
    ratio = slowdown(search.result.per_workload, fresh.result.per_workload)
    return _within(fresh.result.passed, ratio)


def _within(passed: bool, ratio: tuple[float, float] | None) -> bool:
    """The rule, from a confirmation's pass and its :func:`slowdown`."""
    if not passed or ratio is None:
        return False
    return ratio[0] <= 1.0 + GEOMEAN_SLOWER and ratio[1] <= WORST_SLOWER


def confirm(
    chosen: Pass,
    passes: list[Pass],
    *,
    final: FinalJudge,
    state: RunState,
    clock: Clock,
    events: Events,
) -> Pass | None:
    """The solution to hand over: ``chosen`` or a runner-up from ``passes`` (the agents'
    full passes), as confirmed in new processes (module docstring). When none could be
    confirmed (time limit, or a stop signal, which abandons the confirmation in progress),
    the best by search score whose confirmation did not fail; None when every candidate
    tried failed its confirmation (never handed over)."""
    hashes = {chosen[0].content_hash}
    queue = [chosen]
    for p in sorted(passes, key=lambda p: (-(p[1].result.score or 0.0), p[0].seq)):
        if p[0].content_hash not in hashes:
            hashes.add(p[0].content_hash)
            queue.append(p)
    confirmed: list[Pass] = []
    failed: set[str] = set()
    for rec, ev in queue[:TRIES]:
        need, left = state.judging_cost({rec.id}), clock.left_total()
        if clock.timed and (left <= 0 or need > left):
            why = f"{max(left, 0.0):.0f} s left, under the {need:.0f} s its judgement took"
            events.log("confirmation_skipped", {"candidate": rec.id, "why": why})
            break
        ok = events.unless_stopped(
            "confirmation", partial(_confirm_one, final, events, rec, ev, confirmed, failed)
        )
        if ok is None or ok:  # cut by a signal: what is confirmed so far decides
            break
    if not confirmed:
        return next((p for p in queue if p[0].id not in failed), None)
    return max(confirmed, key=lambda p: (p[1].result.score or 0.0, -p[0].seq))


def _confirm_one(
    final: FinalJudge,
    events: Events,
    rec: CandidateRecord,
    ev: EvaluationRecord,
    confirmed: list[Pass],
    failed: set[str],
) -> bool:
    """Confirm ``rec`` (its search judgement ``ev``): record the confirmation, its event and
    lesson; add it to ``confirmed`` when it passed, ``rec`` to ``failed`` when it failed.
    Whether it reproduced."""
    fresh = final.judge(
        rec.solution,
        agent=CONFIRMER,
        strategy="confirmation",
        parent=rec.id,
        hypothesis=f"{rec.id} judged again in a new process with empty JIT caches",
        fresh_jit=True,
    )
    ratio = slowdown(ev.result.per_workload, fresh[1].result.per_workload)
    ok = _within(fresh[1].result.passed, ratio)
    events.log(
        "confirmation",
        {
            "candidate": fresh[0].id,
            "of": rec.id,
            "passed": fresh[1].result.passed,
            "stopped": fresh[1].result.stopped_early,
            "score": fresh[1].result.score,
            "search_score": ev.result.score,
            "slowdown": None if ratio is None else round(ratio[0], 4),
            "worst_slowdown": None if ratio is None else round(ratio[1], 4),
            "reproduced": ok,
        },
    )
    events.conclude(_lesson(rec, fresh, ratio, ok))
    if fresh[1].result.passed:
        confirmed.append(fresh)
    elif fresh[1].result.stopped_early != TIME_LIMIT:
        failed.add(rec.id)  # it fails in a new process: not handed over
    return ok


def _lesson(
    rec: CandidateRecord, fresh: Pass, ratio: tuple[float, float] | None, ok: bool
) -> Conclusion:
    """The confirmation's lesson, for the run's conclusions and the shared memory: which
    strategy's solution did (not) keep its speed in a new process, by how much."""
    what = f"{rec.id} ({rec.agent}: {rec.solution.description or rec.strategy})"[:160]
    outcome: Outcome
    if not fresh[1].result.passed and fresh[1].result.stopped_early == TIME_LIMIT:
        # says nothing about the strategy: not a failure for the shared memory
        claim = f"{what} was not confirmed: the time limit cut its judgement in a new process"
        outcome = "no_gain"
    elif not fresh[1].result.passed:
        why = fresh[1].result.stopped_early or "a workload failed"
        claim, outcome = f"{what} did not pass again in a new process ({why})", "failed"
    elif ratio is None:
        claim, outcome = f"{what} shares no workload with its search measurement", "no_gain"
    else:
        verb = "reproduced" if ok else "did not reproduce"
        claim = (
            f"{what} {verb} its speed in a new process with empty JIT caches: "
            f"{ratio[0]:.2f}x its search latency (geomean), worst workload {ratio[1]:.2f}x"
        )
        outcome = "no_gain" if ok else "regressed"
    return Conclusion(
        agent=CONFIRMER,
        strategy="confirmation",
        candidate_id=fresh[0].id,
        claim=claim[:300],
        effect={} if ratio is None else {"all workloads": 1.0 / ratio[0]},
        tags=("confirmation", rec.agent),
        outcome=outcome,
    )
