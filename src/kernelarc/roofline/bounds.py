"""Roofline bounds of a problem's workloads on a device, for reports and agents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernelarc.roofline.flops import count_workload
from kernelarc.roofline.profiles import get_profile
from kernelarc.roofline.score import t_sol_ms


def workload_bounds(
    definition: Any, workloads: Sequence[Any], device: str, profile_name: str | None = None
) -> tuple[dict[str, float], list[str]]:
    """T_sol in ms per workload uuid for ``profile_name`` (default: the device's own
    profile), and the warnings for workloads whose bound could not be computed. On a CUDA
    device, a workload that cannot be counted on meta or small CPU tensors (data-dependent
    shapes too big for the CPU) is counted on real GPU tensors in this process
    (``count_workload(..., gpu_fallback=True)``)."""
    name = profile_name or ("local-cuda" if device.startswith("cuda") else "cpu")
    warnings: list[str] = []
    try:
        profile = get_profile(name)
    except Exception as e:  # reported to the caller, who decides how loud to be
        return {}, [f"no roofline bounds for profile {name!r}: {e}"]
    out: dict[str, float] = {}
    for wl in workloads:
        try:
            cost = count_workload(definition, wl, gpu_fallback=device.startswith("cuda"))
            ms, _ = t_sol_ms(cost, profile)
        except Exception as e:
            warnings.append(f"bound of workload {wl.uuid[:13]} not computed: {e}")
            continue
        if ms is not None and ms > 0:
            out[wl.uuid] = float(ms)
    return out, warnings
