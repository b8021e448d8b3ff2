"""The judgement of a finisher's candidate (the composition, the reference fallback, a
confirmation: ``finish.py``, ``confirm.py``): the full protocol on every workload, recorded in
the store and the run directory like the search's candidates, at no cost to the budget.
"""

from __future__ import annotations

from kernelarc.agents.types import CandidateResult
from kernelarc.guard.verdict import WorkloadOutcome
from kernelarc.orchestration.clock import Clock
from kernelarc.orchestration.config import RunConfig
from kernelarc.orchestration.judge import TIME_LIMIT, GuardLike, results_of, score_of
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.schema import Solution
from kernelarc.store.base import CandidateRecord, EvaluationRecord, Store

Pass = tuple[CandidateRecord, EvaluationRecord]
"""A candidate and its full-protocol evaluation."""


class FinalJudge:
    """Judges and records the candidates made at the end of a run."""

    def __init__(
        self,
        guard: GuardLike,
        config: RunConfig,
        bounds: dict[str, float],
        clock: Clock,
        store: Store,
        run_dir: RunDir,
    ) -> None:
        self.guard, self.config, self.bounds, self.clock = guard, config, bounds, clock
        self.store, self.dir = store, run_dir

    def judge(
        self,
        solution: Solution,
        *,
        agent: str,
        strategy: str,
        parent: str,
        hypothesis: str,
        fresh_jit: bool = False,
    ) -> Pass:
        """Judge a finisher's candidate with the full protocol on every workload and record
        it (``fresh_jit``: in a worker with empty JIT caches, ``Guard.evaluate``). It stops
        at its first failing workload (it cannot be kept), and, under a time limit, after
        the workload in progress when the limit is reached (as the search's judgements do: a
        run overshoots its limit by at most one workload's judgement)."""
        full = self.config.full
        timed = self.clock.timed

        def stop(o: WorkloadOutcome) -> str | None:
            if o.status.value != "PASSED":
                return f"{o.status.value} on workload {o.workload.uuid}"
            return TIME_LIMIT if timed and self.clock.left_total() <= 0 else None

        res = self.guard.evaluate(
            solution,
            rounds=full.rounds,
            warmup=full.warmup,
            iterations=full.iterations,
            stop=stop,
            fresh_jit=fresh_jit,
        )
        per = results_of(res.outcomes, self.bounds)
        passed = res.stopped_early is None and bool(per) and all(r.status == "PASSED" for r in per)
        record = self.store.add_candidate(
            CandidateRecord(
                id=f"c{len(self.store.candidates()) + 1:04d}-{agent}",
                content_hash=solution.content_hash(),
                agent=agent,
                strategy=strategy,
                mode="draft",
                parent_id=parent,
                hypothesis=hypothesis,
                solution=solution,
            )
        )
        self.dir.write_candidate(record)
        result = CandidateResult(
            candidate_id=record.id,
            agent=agent,
            strategy=strategy,
            mode="draft",
            stage="full",
            per_workload=per,
            passed=passed,
            score=score_of(per) if passed else None,
            stopped_early=res.stopped_early,
        )
        ev = self.store.add_evaluation(
            EvaluationRecord(candidate_id=record.id, stage="full", traces=res.traces, result=result)
        )
        self.dir.append_traces(res.traces)
        return record, ev
