"""A candidate worker's preparation for torch.compile, before the sentinel is armed.

``prewarm_inductor`` imports what torch.compile needs on its first call and settles
Inductor's CPU vector-ISA check (library work, not the solution's); ``uses_inductor`` tells
whether a solution's sources compile at run time (``RUNTIME_COMPILE_MARKERS``). Not
covered: a solution that reaches Inductor with none of those markers in its sources is not
prepared; its first compile then meets the ISA check with the sentinel armed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kernelarc.problem.schema import RUNTIME_COMPILE_MARKERS


def uses_inductor(root: Path) -> bool:
    return any(
        m in p.read_text(errors="replace")
        for p in root.rglob("*.py")
        for m in RUNTIME_COMPILE_MARKERS
    )


@dataclass
class Prewarm:
    """What :func:`prewarm_inductor` did: seconds it took and notes for the verdict."""

    seconds: float
    probe: bool
    notes: list[str] = field(default_factory=list)


def prewarm_inductor(*, probe: bool) -> Prewarm:
    """Import what torch.compile needs on its first call and settle Inductor's CPU vector-ISA
    check, before the sentinel is armed (library work, not the solution's; cached in this
    process afterwards).

    The ISA check builds a test library per ISA the CPU has and starts a Python subprocess
    to load each (the sentinel would block that subprocess). With ``probe`` it runs as
    torch runs it (the CPU device: Inductor's CPU kernels are the solution's speed). Without
    it (a CUDA device), ``cpp.vec_isa_ok = False`` answers it without building or starting
    anything: CPU kernels Inductor generates inside a CUDA solution's graph are then scalar,
    GPU kernels are unchanged; the check run as torch runs it can cost a CUDA worker tens of
    seconds of setup (docs/PERFORMANCE.md). Timed in ``load.prewarm`` / ``spare_prewarm``."""
    t0 = time.monotonic()
    notes: list[str] = []
    try:
        import torch._dynamo
        import torch._inductor.compile_fx  # noqa: F401
        from torch._inductor import config as inductor_config
        from torch._inductor import cpu_vec_isa

        if probe:
            cpu_vec_isa.valid_vec_isa_list()
        else:
            inductor_config.cpp.vec_isa_ok = False
    except Exception as e:  # reported with the verdict; the solution may still work
        notes.append(f"torch.compile pre-warm failed: {type(e).__name__}: {e}")
    return Prewarm(time.monotonic() - t0, probe, notes)
