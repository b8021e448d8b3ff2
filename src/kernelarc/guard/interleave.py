"""Interleaved A/B timing of two solutions over several worker processes (``Guard.compare``).

Each side is timed in ``processes`` candidate workers of its own, started one pair at a time
(pair p: A then B when p is even, B then A when odd) and closed before the next pair starts,
over the same input seeds, so slow drift of clocks and temperature falls on both alike and a
steady offset of one process shows as spread between processes; then
``noise.is_better_across`` decides. Costs ``2 * processes`` worker starts and builds. Not
covered: correctness (judge both with ``Guard.evaluate`` first; a failure here raises the
``Verdict``).
"""

from __future__ import annotations

import time

from kernelarc.guard.messages import CandidateTimed, TimeRequest
from kernelarc.guard.noise import MIN_PROCESSES, Decision, Samples, is_better_across
from kernelarc.guard.protocol import POOL_ROUND_BASE, derive_seed
from kernelarc.guard.session import CandidateSession, GuardSide
from kernelarc.problem.schema import Solution, Workload


def interleaved_compare(
    guard: GuardSide,
    candidate: Solution,
    incumbent: Solution,
    chosen: list[Workload],
    *,
    processes: int,
    min_gain: float,
    z: float,
) -> Decision:
    """Time ``candidate`` and ``incumbent`` on ``chosen`` in ``processes`` worker pairs (one
    block of ``iterations // processes`` calls, at least 3, per workload and process), over
    the same seeds; then :func:`kernelarc.guard.noise.is_better_across` decides."""
    if processes < MIN_PROCESSES:
        raise ValueError(
            f"processes={processes}: at least {MIN_PROCESSES} worker processes per side are "
            "needed to estimate the spread between processes"
        )
    settings = guard.settings()
    cfg = settings.config
    per_block = max(3, cfg.iterations // processes)
    seeds = {
        wl.uuid: [
            derive_seed(cfg.seed, wl.uuid, POOL_ROUND_BASE + i)
            for i in range(cfg.warmup + per_block)
        ]
        for wl in chosen
    }
    runs: list[list[list[Samples]]] = [[], []]
    for p in range(processes):
        order = (0, 1) if p % 2 == 0 else (1, 0)
        for side in order:
            session = CandidateSession(guard, (candidate, incumbent)[side], settings)
            try:
                if session.fatal is not None:
                    raise session.fatal
                run = []
                for wl in chosen:
                    request = TimeRequest(
                        workload=wl,
                        seeds=seeds[wl.uuid],
                        warmup=cfg.warmup,
                        iterations=per_block,
                        one_sample=guard.one_timed_call(wl),
                        exchange_dir=str(guard.tmp),
                        cupti=settings.cupti,
                    )
                    reply = session.cand(
                        request,
                        CandidateTimed,
                        time.monotonic() + cfg.timeout,
                        "comparison timing",
                    )
                    run.append(Samples(latencies_ms=reply.samples_ms))
                runs[side].append(run)
            finally:
                session.close()
    return is_better_across(runs[0], runs[1], min_gain=min_gain, z=z)
