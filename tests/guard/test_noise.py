"""Tests of the noise-aware comparison rule in kernelarc.guard.noise."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from kernelarc.guard.noise import MIN_SAMPLES, Samples, is_better, is_better_across, t_quantile


def draw(median: float, rel_noise: float, n: int, seed: int) -> Samples:
    """n latencies around ``median`` with multiplicative normal noise of ``rel_noise``."""
    rng = random.Random(seed)
    return Samples(latencies_ms=[median * math.exp(rng.gauss(0.0, rel_noise)) for _ in range(n)])


def workloads(median: float, rel_noise: float, n: int, seed: int, w: int = 4) -> list[Samples]:
    return [draw(median * (1 + k), rel_noise, n, seed * 100 + k) for k in range(w)]


def test_sample_statistics() -> None:
    s = Samples(latencies_ms=[5.0, 1.0, 4.0, 2.0, 3.0])
    assert s.median == 3.0
    assert s.p10 == pytest.approx(1.4)
    assert s.p90 == pytest.approx(4.6)
    assert s.mad == 1.0
    assert s.rel_spread == pytest.approx((4.6 - 1.4) / 3.0)
    assert Samples(latencies_ms=[1.0, 2.0, 3.0, 4.0]).median == 2.5


def test_samples_must_be_positive_and_finite() -> None:
    for bad in ([], [1.0, 0.0], [1.0, -2.0], [math.nan], [math.inf]):
        with pytest.raises(ValidationError):
            Samples(latencies_ms=bad)


def test_same_samples_are_not_better() -> None:
    inc = workloads(1.0, 0.02, 30, seed=1)
    d = is_better(inc, inc)
    assert not d.better
    assert d.speedup == pytest.approx(1.0)


def test_identical_distributions_are_not_better() -> None:
    for seed in range(20):
        d = is_better(workloads(1.0, 0.02, 30, seed=seed), workloads(1.0, 0.02, 30, seed + 50))
        assert not d.better, (seed, d.reason)


def test_clear_ten_percent_gain_is_better() -> None:
    inc = workloads(1.0, 0.02, 30, seed=2)
    cand = workloads(1.0 / 1.1, 0.02, 30, seed=3)
    d = is_better(cand, inc)
    assert d.better, d.reason
    assert d.speedup == pytest.approx(1.1, rel=0.02)
    assert d.threshold < d.speedup
    assert len(d.per_workload) == 4
    assert all(row.speedup > 1.05 for row in d.per_workload)


def test_half_percent_gain_is_below_min_gain() -> None:
    inc = workloads(1.0, 0.001, 50, seed=4)
    cand = workloads(1.0 / 1.005, 0.001, 50, seed=5)
    d = is_better(cand, inc)
    assert not d.better
    assert d.speedup > 1.0  # real, measurable, but not worth a step
    assert "minimum gain" in d.reason
    assert is_better(cand, inc, min_gain=0.001).better  # the noise test alone passes


def test_noisy_five_percent_with_few_samples_is_not_better() -> None:
    # 20% spread (p90-p10 over median) is a log sigma of about 0.2 / 2.563 = 0.078
    inc = [draw(1.0, 0.078, 5, seed=6)]
    cand = [draw(1.0 / 1.05, 0.078, 5, seed=7)]
    assert 0.1 < inc[0].rel_spread < 0.4
    d = is_better(cand, inc)
    assert not d.better
    assert "noise" in d.reason
    # the same gain with the same noise becomes significant with many samples
    inc_many = [draw(1.0, 0.078, 2000, seed=8)]
    cand_many = [draw(1.0 / 1.05, 0.078, 2000, seed=9)]
    assert is_better(cand_many, inc_many).better


def test_more_workloads_reduce_the_noise_bar() -> None:
    one = is_better(workloads(0.95, 0.05, 10, 10, w=1), workloads(1.0, 0.05, 10, 11, w=1))
    many = is_better(workloads(0.95, 0.05, 10, 10, w=16), workloads(1.0, 0.05, 10, 11, w=16))
    assert many.threshold < one.threshold


def test_slower_candidate_is_not_better() -> None:
    d = is_better(workloads(1.2, 0.01, 20, 12), workloads(1.0, 0.01, 20, 13))
    assert not d.better and d.speedup < 1.0


def test_zero_mad_uses_noise_floor() -> None:
    inc = [Samples(latencies_ms=[1.0] * 10)]
    cand = [Samples(latencies_ms=[1.0 / 1.02] * 10)]
    d = is_better(cand, inc)
    expected_sigma = math.sqrt(2) * math.sqrt(math.pi / 2) * 1e-3 / math.sqrt(10)
    assert d.per_workload[0].sigma == pytest.approx(expected_sigma)
    assert d.better
    assert not is_better(cand, inc, noise_floor=0.05).better


def test_mismatched_lengths_raise() -> None:
    with pytest.raises(ValueError, match="same workloads"):
        is_better(workloads(1.0, 0.01, 10, 1, w=3), workloads(1.0, 0.01, 10, 2, w=2))


def test_empty_and_too_few_samples_raise() -> None:
    with pytest.raises(ValueError, match="no workloads"):
        is_better([], [])
    few = [Samples(latencies_ms=[1.0] * (MIN_SAMPLES - 1))]
    with pytest.raises(ValueError, match="incumbent workload 0"):
        is_better(workloads(1.0, 0.01, 10, 1, w=1), few)


def test_deterministic() -> None:
    a, b = workloads(0.97, 0.03, 15, 20), workloads(1.0, 0.03, 15, 21)
    assert is_better(a, b) == is_better(a, b)


# --------------------------------------------------------------- across worker processes


def processes(median: float, offsets: list[float], seed: int, w: int = 2) -> list[list[Samples]]:
    """One run per process: ``w`` workloads, 30 samples of 0.5% noise, the process's latencies
    scaled by its steady offset (what a process's placement on a loaded CPU does)."""
    return [workloads(median * off, 0.005, 30, seed * 10 + p, w) for p, off in enumerate(offsets)]


def test_t_quantile_matches_known_values() -> None:
    # Student-t quantiles (scipy.stats.t.ppf): 97.5% at 6 dof; the 3-sigma tail at 4, 6, 30
    assert t_quantile(1.959964, 6) == pytest.approx(2.447, abs=0.002)
    assert t_quantile(3.0, 4) == pytest.approx(6.620, rel=0.01)
    assert t_quantile(3.0, 6) == pytest.approx(4.904, rel=0.005)
    assert t_quantile(3.0, 30) == pytest.approx(3.270, rel=0.002)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(3.0, 0)


def test_a_steady_process_offset_is_not_a_gain() -> None:
    # The same code: the candidate's four processes happen to sit 1-7% below the incumbent's.
    cand = processes(1.0, [0.93, 0.95, 0.97, 0.99], seed=1)
    inc = processes(1.0, [0.97, 0.99, 1.01, 1.03], seed=2)
    pooled = [
        [Samples(latencies_ms=[x for run in side for x in run[k].latencies_ms]) for k in range(2)]
        for side in (cand, inc)
    ]
    assert is_better(pooled[0], pooled[1]).better  # the within-process rule is fooled
    d = is_better_across(cand, inc)
    assert not d.better, d.reason
    assert d.speedup == pytest.approx(1.04, rel=0.01)
    assert "between 4 + 4 processes" in d.reason


def test_a_clear_gain_across_processes_is_better() -> None:
    cand = processes(1.0 / 1.1, [0.995, 1.0, 1.005, 1.0], seed=3)
    inc = processes(1.0, [1.0, 0.995, 1.0, 1.005], seed=4)
    d = is_better_across(cand, inc)
    assert d.better, d.reason
    assert d.speedup == pytest.approx(1.1, rel=0.01)
    assert len(d.per_workload) == 2 and all(r.speedup > 1.08 for r in d.per_workload)


def test_a_slower_candidate_across_processes_is_not_better() -> None:
    # (The guard-level test of Guard.compare times the clearly faster direction only.)
    d = is_better_across(processes(1.2, [1.0] * 4, seed=5), processes(1.0, [1.0] * 4, seed=6))
    assert not d.better and d.speedup == pytest.approx(1 / 1.2, rel=0.01), d.reason
    assert "not above the minimum gain" in d.reason


def test_same_code_in_noisy_processes_is_never_better() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        offsets = [[math.exp(rng.gauss(0.0, 0.04)) for _ in range(4)] for _ in range(2)]
        d = is_better_across(
            processes(1.0, offsets[0], seed), processes(1.0, offsets[1], seed + 50)
        )
        assert not d.better, (seed, d.reason)


def test_across_needs_processes_and_matching_workloads() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        is_better_across(processes(1.0, [1.0, 1.0], 1), processes(1.0, [1.0] * 3, 2))
    with pytest.raises(ValueError, match="incumbent process 1 has samples for 1 workloads"):
        inc = processes(1.0, [1.0] * 3, 2)
        inc[1] = inc[1][:1]
        is_better_across(processes(1.0, [1.0] * 3, 1), inc)
    with pytest.raises(ValueError, match="no workloads"):
        is_better_across([], [])
