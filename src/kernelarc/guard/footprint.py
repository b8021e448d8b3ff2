"""Workloads too large for the device's memory in the guard, said before anything is judged.

The most the guard holds of a workload at once is its inputs and its outputs twice: the
reference's worker makes its inputs and outputs while the candidate's outputs, exported
to it for the comparison, are still held (``session.py``); the candidate's own call holds
the inputs and its outputs, beside copies of inputs under ``GuardConfig.copy_bytes``
(larger ones are fingerprinted, ``call_checks.py``). A workload near the device's memory by
this count fails every candidate, the reference's own code among them, after minutes of
judging (docs/GUARD.md); :func:`memory_warnings` names such workloads at the start.

Covered: the declared tensor inputs and outputs of each workload (``problem.inputs``'
estimates, custom inputs by their declared shapes). Not covered: the solution's and the
reference's temporaries, the copies of small inputs, memory other processes hold, outputs
that alias inputs (counted twice), and the host's memory on the CPU (nothing is said
there).
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelarc.problem.inputs import estimate_input_bytes, estimate_output_bytes
from kernelarc.problem.schema import Definition, Workload

WARN_SHARE = 0.8
"""A workload is named when its count exceeds this share of the device's memory: the rest
is little room for temporaries, the workers' CUDA contexts and the allocator's slack."""

SHOWN = 3
"""Workloads named one by one; the rest are counted."""

GIB = float(1 << 30)


def guard_need_bytes(definition: Definition, workload: Workload) -> tuple[int, int, int]:
    """(inputs, outputs, the count) in bytes: the count is the inputs plus twice the
    outputs (module docstring)."""
    ins = estimate_input_bytes(definition, workload)
    outs = estimate_output_bytes(definition, workload)
    return ins, outs, ins + 2 * outs


def memory_warnings(
    definition: Definition, workloads: Sequence[Workload], total_bytes: int
) -> list[str]:
    """A line per workload whose count exceeds :data:`WARN_SHARE` of ``total_bytes`` (the
    device's memory), the largest first (:data:`SHOWN` of them, then how many more), each
    naming the workload, its sizes and what to do; one line when every workload does.
    Workloads whose axes do not resolve are left to the guard to report."""
    found = []
    for i, wl in enumerate(workloads):
        try:
            ins, outs, need = guard_need_bytes(definition, wl)
        except (ValueError, KeyError):  # axes or dtype: the guard reports it when judging
            continue
        if need > WARN_SHARE * total_bytes:
            found.append((need, i, wl, ins, outs))
    if not found:
        return []
    found.sort(key=lambda f: (-f[0], f[1]))
    total = f"the device's {total_bytes / GIB:.1f} GiB in the guard"
    if len(found) == len(workloads):  # none fits: one line, for the smallest
        need, _, wl, ins, outs = found[-1]
        verdict = "too large for" if need > total_bytes else "too large, or close to it, for"
        return [
            f"all {len(workloads)} workloads are {verdict} {total}: in the smallest, "
            f"{wl.uuid} ({_axes(wl)}), {_sizes(ins, outs, need)}; use a device with more "
            "memory"
        ]
    lines = []
    for need, _, wl, ins, outs in found[:SHOWN]:
        verdict = "cannot fit" if need > total_bytes else "may not fit"
        lines.append(
            f"workload {wl.uuid} ({_axes(wl)}) {verdict} {total}: {_sizes(ins, outs, need)}; "
            f"leave it out with --workloads '!{wl.uuid}' or use a device with more memory"
        )
    if len(found) > SHOWN:
        lines.append(f"... and {len(found) - SHOWN} more of the {len(workloads)} workloads")
    return lines


def _axes(wl: Workload) -> str:
    return ", ".join(f"{k}={v}" for k, v in wl.axes.items())


def _sizes(ins: int, outs: int, need: int) -> str:
    return (
        f"its inputs ({ins / GIB:.1f} GiB) and its outputs twice, the solution's and the "
        f"reference's ({outs / GIB:.1f} GiB each), take {need / GIB:.1f} GiB before any "
        "temporary"
    )


def device_bytes(device: str) -> int | None:
    """The memory of ``device`` (``cuda[:N]``) in bytes; None on the CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    index = torch.device(device).index or 0
    return int(torch.cuda.get_device_properties(index).total_memory)


def device_warnings(
    definition: Definition, workloads: Sequence[Workload], device: str
) -> list[str]:
    """:func:`memory_warnings` for ``device`` (``cuda[:N]``; none on the CPU)."""
    total = device_bytes(device)
    return [] if total is None else memory_warnings(definition, workloads, total)


def two_calls_crowd(one_call_bytes: int, total: int) -> bool:
    """Whether two timed calls' outputs take over a quarter of a device of ``total`` bytes:
    then only the last timed call's outputs are judged, not also the middle one's. Each
    judged call's outputs stay exported while the reference worker computes its own, and
    two such sets beside the timed inputs can leave the reference worker out of memory."""
    return 2 * one_call_bytes > total // 4


def one_timed_call(definition: Definition, workload: Workload, total: int | None) -> bool:
    """Whether, by its declared outputs, only the last timed call of ``workload`` is judged
    on a device of ``total`` bytes (None: the CPU, never): the candidate's worker then keeps
    no earlier call's outputs during the timing and not the last call's inputs for the
    re-check, and lets go of its outputs before the reference is timed (``session.py``):
    otherwise a timing holds the inputs and two calls' outputs at once."""
    if total is None:
        return False
    try:
        size = estimate_output_bytes(definition, workload)
    except (ValueError, KeyError):  # axes that do not resolve: the call reports them
        return False
    return two_calls_crowd(size, total)


__all__ = [
    "GIB",
    "WARN_SHARE",
    "device_bytes",
    "device_warnings",
    "guard_need_bytes",
    "memory_warnings",
    "one_timed_call",
    "two_calls_crowd",
]
