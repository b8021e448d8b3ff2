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
