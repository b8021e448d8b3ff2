"""A noise-aware "is the candidate faster than the incumbent" rule for the search.

Input: for each workload w, latency samples of the candidate and of the incumbent, taken
interleaved (A, B, A, B blocks in one worker session) so that slow drift of clocks and
temperature falls on both sides alike. The rule works on log latencies, where a speedup is
a difference and noise is roughly symmetric:

1. Per workload, the log-ratio ``r_w = log(median_inc / median_cand)`` (> 0: candidate faster).
2. Its noise: for each side, a robust standard deviation of the log latencies,
   ``s = max(1.4826 * MAD(log t), noise_floor)`` (1.4826 makes the MAD a consistent estimate
   of a normal standard deviation), and the standard error of the median,
   ``1.2533 * s / sqrt(n)`` (the median's efficiency factor sqrt(pi/2) for normal data). The
   two sides are independent, so ``sigma_w^2 = se_inc^2 + se_cand^2``.
3. The geomean speedup ``S = exp(mean_w r_w)`` and the noise of the mean,
   ``sigma = sqrt(sum_w sigma_w^2) / W``.
4. Better iff ``S > 1 + min_gain`` (the gain is worth having) and ``mean r > z * sigma``
   (the gain is not noise; z = 3 keeps false positives near 0.1% per comparison even with
   many comparisons in a search). Both together read ``S > threshold`` with
   ``threshold = max(1 + min_gain, exp(z * sigma))``.

The noise floor (default 0.1% per sample) stands for timer resolution: identical quantised
readings give a MAD of 0, which would otherwise claim infinite certainty. At least
:data:`MIN_SAMPLES` samples per side are needed to estimate spread at all.

Deterministic: no resampling. Not covered: taking the measurements (the evaluator's job),
outlier rejection (the median and MAD already ignore a few), and correlation between the
interleaved pairs (ignored, which makes the rule conservative when drift is shared).

Across processes (:func:`is_better_across`). The rule above sees only the noise within one
worker process. Two processes running the same code can differ by a steady offset (on a
loaded CPU, 3-8%: memory placement, cores, threads left spinning), which no number of
samples in one process reveals. So each side is measured in P >= 3 processes of its own and
the process is the unit: per process, the mean over workloads of the log median, ``L``; the
speedup is ``exp(mean L_inc - mean L_cand)``; its noise, from the pooled variance of ``L``
within each side, ``se = s * sqrt(1/P_cand + 1/P_inc)`` with ``P_cand + P_inc - 2`` degrees
of freedom, is weighed with the Student-t quantile that has the normal tail of ``z`` (a
Cornish-Fisher expansion). The candidate is better when the speedup also clears the
within-process bar of :func:`is_better` on all samples pooled. With few processes the t
quantile is large (z = 3, 4 + 4 processes: 4.9): the rule asks the data to show the gain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Fewer samples than this cannot estimate their own spread.
MIN_SAMPLES = 3
#: MAD -> standard deviation for normal data.
_MAD_TO_SIGMA = 1.4826
#: Standard error of the median relative to the mean's, for normal data: sqrt(pi/2).
_MEDIAN_SE = math.sqrt(math.pi / 2)


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty sequence."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _median(values: Sequence[float]) -> float:
    return _quantile(values, 0.5)


def _mad(values: Sequence[float]) -> float:
    m = _median(values)
    return _median([abs(v - m) for v in values])


class Samples(BaseModel):
    """Latencies of one solution on one workload, in milliseconds."""

    model_config = ConfigDict(frozen=True)

    latencies_ms: list[float] = Field(min_length=1)

    @field_validator("latencies_ms")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        bad = [x for x in v if not (math.isfinite(x) and x > 0)]
        if bad:
            raise ValueError(f"latencies must be finite and positive, got {bad[:3]}")
        return v

    @property
    def n(self) -> int:
        return len(self.latencies_ms)

    @property
    def median(self) -> float:
        return _median(self.latencies_ms)

    @property
    def p10(self) -> float:
        return _quantile(self.latencies_ms, 0.1)

    @property
    def p90(self) -> float:
        return _quantile(self.latencies_ms, 0.9)

    @property
    def mad(self) -> float:
        """Median absolute deviation from the median, in ms (unscaled)."""
        return _mad(self.latencies_ms)

    @property
    def rel_spread(self) -> float:
        """(p90 - p10) / median: the width of the middle 80%, relative."""
        return (self.p90 - self.p10) / self.median

    def log_sigma(self, noise_floor: float) -> float:
        """Robust standard deviation of the log latencies, at least ``noise_floor``."""
        return max(_MAD_TO_SIGMA * _mad([math.log(x) for x in self.latencies_ms]), noise_floor)


class WorkloadComparison(BaseModel):
    index: int
    candidate_median_ms: float
    incumbent_median_ms: float
    speedup: float
    """incumbent median / candidate median (> 1: candidate faster)."""
    log_ratio: float
    sigma: float
    """Standard error of ``log_ratio``."""


class Decision(BaseModel):
    better: bool
    speedup: float
    """Geometric mean over workloads of incumbent median / candidate median."""
    threshold: float
    """The speedup the candidate had to exceed: max(1 + min_gain, exp(z * sigma))."""
    per_workload: list[WorkloadComparison]
    reason: str


def is_better(
    candidate: Sequence[Samples],
    incumbent: Sequence[Samples],
    *,
    min_gain: float = 0.01,
    z: float = 3.0,
    noise_floor: float = 1e-3,
) -> Decision:
    """Decide whether ``candidate`` beats ``incumbent`` (one :class:`Samples` per workload,
    in the same workload order on both sides). See the module docstring for the rule."""
    if len(candidate) != len(incumbent):
        raise ValueError(
            f"candidate has samples for {len(candidate)} workloads, the incumbent for "
            f"{len(incumbent)}: compare the same workloads on both sides"
        )
    if not candidate:
        raise ValueError("no workloads to compare")
    if min_gain < 0 or z < 0 or noise_floor < 0:
        raise ValueError("min_gain, z and noise_floor must be non-negative")
    for side, seq in (("candidate", candidate), ("incumbent", incumbent)):
        for i, s in enumerate(seq):
            if s.n < MIN_SAMPLES:
                raise ValueError(
                    f"{side} workload {i} has {s.n} samples; at least {MIN_SAMPLES} are "
                    "needed to estimate noise: measure more calls"
                )

    rows: list[WorkloadComparison] = []
    for i, (c, b) in enumerate(zip(candidate, incumbent, strict=True)):
        cm, bm = c.median, b.median
        se_c = _MEDIAN_SE * c.log_sigma(noise_floor) / math.sqrt(c.n)
        se_b = _MEDIAN_SE * b.log_sigma(noise_floor) / math.sqrt(b.n)
        r = math.log(bm / cm)
        rows.append(
            WorkloadComparison(
                index=i,
                candidate_median_ms=cm,
                incumbent_median_ms=bm,
                speedup=bm / cm,
                log_ratio=r,
                sigma=math.hypot(se_c, se_b),
            )
        )

    w = len(rows)
    mean_r = sum(row.log_ratio for row in rows) / w
    sigma = math.sqrt(sum(row.sigma**2 for row in rows)) / w
    speedup = math.exp(mean_r)
    gain_bar = 1.0 + min_gain
    noise_bar = math.exp(z * sigma)
    threshold = max(gain_bar, noise_bar)
    better = speedup > threshold
    if better:
        reason = f"geomean speedup {speedup:.4f}x over {w} workloads beats {threshold:.4f}x"
    elif speedup <= gain_bar:
        reason = f"geomean speedup {speedup:.4f}x is not above the minimum gain {gain_bar:.4f}x"
    else:
        reason = (
            f"geomean speedup {speedup:.4f}x is within noise: needs {threshold:.4f}x "
            f"({z:g} sigma, sigma of the mean log-ratio {sigma:.4f})"
        )
    return Decision(
        better=better, speedup=speedup, threshold=threshold, per_workload=rows, reason=reason
    )


#: Fewer processes per side than this cannot estimate the process-to-process spread.
MIN_PROCESSES = 3


def t_quantile(z: float, dof: int) -> float:
    """The Student-t quantile with ``dof`` degrees of freedom at the normal tail probability
    of ``z`` (Cornish-Fisher expansion to 1/dof^4). Against the exact values: within 1% for
    z <= 3 and dof >= 4 (3 sigma, 4 dof: 6.58 vs 6.62); below them, so less strict, for
    larger z or fewer dof (4 sigma, 4 dof: 16.6 vs 17.4)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be positive, got {dof}")
    n = float(dof)
    terms = (
        z,
        (z**3 + z) / (4 * n),
        (5 * z**5 + 16 * z**3 + 3 * z) / (96 * n**2),
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * n**3),
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * n**4),
    )
    return sum(terms)


def _process_levels(runs: Sequence[Sequence[Samples]], side: str, w: int) -> list[list[float]]:
    """Per process, per workload, the log median; checks the shape of ``runs``."""
    if len(runs) < MIN_PROCESSES:
        raise ValueError(
            f"{side} was measured in {len(runs)} processes; at least {MIN_PROCESSES} are "
            "needed to estimate the spread between processes"
        )
    for p, run in enumerate(runs):
        if len(run) != w:
            raise ValueError(f"{side} process {p} has samples for {len(run)} workloads, not {w}")
    return [[math.log(s.median) for s in run] for run in runs]


def is_better_across(
    candidate: Sequence[Sequence[Samples]],
    incumbent: Sequence[Sequence[Samples]],
    *,
    min_gain: float = 0.01,
    z: float = 3.0,
    noise_floor: float = 1e-3,
) -> Decision:
    """Decide whether ``candidate`` beats ``incumbent`` from measurements in several worker
    processes per side (outer: processes, inner: one :class:`Samples` per workload, in the
    same workload order everywhere). See the module docstring for the rule."""
    if not candidate or not candidate[0]:
        raise ValueError("no workloads to compare")
    w = len(candidate[0])
    levels_c = _process_levels(candidate, "candidate", w)
    levels_i = _process_levels(incumbent, "incumbent", w)
    pooled = [
        [Samples(latencies_ms=[x for run in side for x in run[k].latencies_ms]) for k in range(w)]
        for side in (candidate, incumbent)
    ]
    within = is_better(pooled[0], pooled[1], min_gain=min_gain, z=z, noise_floor=noise_floor)

    def centre(levels: list[list[float]], k: int) -> float:
        return sum(run[k] for run in levels) / len(levels)

    rows = []
    for row in within.per_workload:
        r = centre(levels_i, row.index) - centre(levels_c, row.index)
        rows.append(row.model_copy(update={"log_ratio": r, "speedup": math.exp(r)}))
    per_process = [[sum(run) / w for run in levels] for levels in (levels_c, levels_i)]
    means = [sum(v) / len(v) for v in per_process]
    dof = len(per_process[0]) + len(per_process[1]) - 2
    ss = sum((x - m) ** 2 for v, m in zip(per_process, means, strict=True) for x in v)
    se = math.sqrt(ss / dof) * math.sqrt(1 / len(per_process[0]) + 1 / len(per_process[1]))
    speedup = math.exp(means[1] - means[0])
    process_bar = math.exp(t_quantile(z, dof) * se)
    threshold = max(within.threshold, process_bar)
    better = speedup > threshold
    procs = f"{len(candidate)} + {len(incumbent)} processes"
    if better:
        reason = (
            f"geomean speedup {speedup:.4f}x over {w} workloads, {procs}, beats {threshold:.4f}x"
        )
    elif speedup <= 1.0 + min_gain:
        reason = f"geomean speedup {speedup:.4f}x is not above the minimum gain {1 + min_gain:.4f}x"
    else:
        reason = (
            f"geomean speedup {speedup:.4f}x is within noise: needs {threshold:.4f}x (within "
            f"a process {within.threshold:.4f}x; between {procs} {process_bar:.4f}x, "
            f"process spread {math.sqrt(ss / dof):.4f} in log latency)"
        )
    return Decision(
        better=better, speedup=speedup, threshold=threshold, per_workload=rows, reason=reason
    )
