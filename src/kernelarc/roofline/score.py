"""Speed-of-light time, SOL score and fraction of bound.

``t_sol_ms(cost, profile)`` is the roofline bound of one workload::

    T_sol = max( sum over classes c of flops[c] / rate(c),  bytes / dram_bandwidth )

Two conventions fix how a dtype class is charged (``docs/ROOFLINE.md`` has the evidence):

- ``"solar"`` (default; what SOL-ExecBench's leaderboard uses): fp32 and tf32 matmul flops
  are charged at the bf16 tensor-core rate (a kernel may use tensor cores for an fp32
  problem as long as it passes the tolerance), and the profile's ``fixed_latency_s`` is
  added (0.4 us on B200, 0 elsewhere).
- ``"strict"``: every class at its own rate, nothing added: a pure roofline.

Unsupported classes (``peak_flops[c] is None``) are charged at ``emulated_as[c]`` in both.

``sol_score(t_k, t_sol, t_b)`` is SOL-ExecBench's per-workload score
``1 / (1 + (t_k - t_sol) / (t_b - t_sol))`` (0.5 at the baseline, 1 at the bound); when
``t_b <= t_sol`` it is 1 if ``t_k <= t_sol`` else 0. ``fraction_of_bound`` is
``t_sol / t_k``. Not covered: counting (``flops``) and the constants (``profiles``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from kernelarc.errors import KernelArcError

if TYPE_CHECKING:
    from kernelarc.roofline.flops import WorkloadCost
    from kernelarc.roofline.profiles import DeviceProfile

Bound = Literal["compute", "memory"]
Convention = Literal["solar", "strict"]
CONVENTIONS: tuple[str, ...] = ("solar", "strict")
_TENSOR_CORE_ALIASES = {"fp32": "bf16", "tf32": "bf16"}


class SolUnavailableError(KernelArcError):
    """A bound cannot be formed: the workload's flops are unknown."""


def charged_rate(
    profile: DeviceProfile, dtype_class: str, convention: Convention = "solar"
) -> float:
    """FLOP/s a class is charged at on ``profile`` under ``convention``."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, not {convention!r}")
    if convention == "solar":
        dtype_class = _TENSOR_CORE_ALIASES.get(dtype_class, dtype_class)
    return profile.rate(dtype_class)


def compute_seconds(
    cost: WorkloadCost, profile: DeviceProfile, convention: Convention = "solar"
) -> float:
    if cost.flops_by_class is None:
        raise SolUnavailableError(cost.reason or f"{cost.definition}: flops unknown")
    return sum(f / charged_rate(profile, c, convention) for c, f in cost.flops_by_class.items())


def memory_seconds(cost: WorkloadCost, profile: DeviceProfile) -> float:
    return cost.bytes / profile.dram_bandwidth


def t_sol_ms(
    cost: WorkloadCost, profile: DeviceProfile, *, convention: Convention = "solar"
) -> tuple[float, Bound]:
    """The speed-of-light time in ms and which term bounds it (ties go to memory)."""
    compute = compute_seconds(cost, profile, convention)
    memory = memory_seconds(cost, profile)
    latency = profile.fixed_latency_s if convention == "solar" else 0.0
    bound: Bound = "compute" if compute > memory else "memory"
    return (max(compute, memory) + latency) * 1e3, bound


def _check_time(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite time >= 0, got {value!r}")


def sol_score(t_k: float, t_sol: float, t_b: float) -> float:
    """SOL-ExecBench's score of one workload: kernel time ``t_k``, bound ``t_sol``,
    baseline ``t_b`` (any one unit). A kernel faster than the bound scores above 1."""
    for name, value in (("t_k", t_k), ("t_sol", t_sol), ("t_b", t_b)):
        _check_time(name, value)
    if t_b <= t_sol:
        return 1.0 if t_k <= t_sol else 0.0
    return 1.0 / (1.0 + (t_k - t_sol) / (t_b - t_sol))


def fraction_of_bound(t_k: float, t_sol: float) -> float:
    """``t_sol / t_k``: 1.0 at the speed of light, smaller when slower."""
    _check_time("t_sol", t_sol)
    _check_time("t_k", t_k)
    if t_k == 0:
        raise ValueError("t_k must be > 0 (a measured kernel time)")
    return t_sol / t_k
