"""Interleaved A/B timing of two solutions in one guard session (``Guard.compare``).

Both solutions get a candidate worker of their own; per workload they are timed in
alternating blocks (A B, B A, A B, ...) over the same input seeds, so slow drift of clocks
and temperature falls on both alike, and ``noise.is_better`` decides from the samples. Not
covered: correctness (judge both with ``Guard.evaluate`` first; a failure here raises the
``Verdict``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kernelarc.guard.noise import Decision, Samples, is_better
from kernelarc.guard.protocol import POOL_ROUND_BASE, derive_seed
from kernelarc.guard.session import CandidateSession
from kernelarc.problem.schema import Solution, Workload

if TYPE_CHECKING:
    from kernelarc.guard.evaluator import Guard


def interleaved_compare(
    guard: Guard,
    candidate: Solution,
    incumbent: Solution,
    chosen: list[Workload],
    *,
    blocks: int,
    min_gain: float,
    z: float,
) -> Decision:
    """Time ``candidate`` and ``incumbent`` on ``chosen`` in ``blocks`` alternating blocks
    (A B, B A, A B, ...), each in a candidate worker of its own, over the same seeds; then
    :func:`kernelarc.guard.noise.is_better` decides."""
    cfg = guard.config
    per_block = max(3, cfg.iterations // blocks)
    sessions = [CandidateSession(guard, candidate), CandidateSession(guard, incumbent)]
    samples: list[list[list[float]]] = [[[] for _ in chosen] for _ in sessions]
    try:
        for s in sessions:
            if s.fatal is not None:
                raise s.fatal
        for w, wl in enumerate(chosen):
            seeds = [
                derive_seed(cfg.seed, wl.uuid, POOL_ROUND_BASE + i)
                for i in range(cfg.warmup + per_block)
            ]
            deadline = time.monotonic() + cfg.timeout
            for b in range(blocks):
                order = (0, 1) if b % 2 == 0 else (1, 0)
                for side in order:
                    reply = sessions[side]._cand(
                        {
                            "op": "time",
                            "workload": wl.model_dump(mode="json"),
                            "seeds": seeds,
                            "warmup": cfg.warmup,
                            "iterations": per_block,
                            "exchange_dir": str(guard.tmp),
                            "cupti": guard._use_cupti,
                        },
                        deadline,
                        "comparison timing",
                    )
                    samples[side][w] += reply["samples_ms"]
    finally:
        for s in sessions:
            s.close()
    cand = [Samples(latencies_ms=x) for x in samples[0]]
    inc = [Samples(latencies_ms=x) for x in samples[1]]
    return is_better(cand, inc, min_gain=min_gain, z=z)
