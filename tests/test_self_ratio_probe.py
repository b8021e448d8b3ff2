"""``benchmarks/self_ratio_probe.py``: the fairness probe run end to end on the CPU.

Covered: both sides of the probe (the eager reference against itself; with ``--compiled``,
the compiler agent's baseline configuration against the guard's own compile of the
reference) judged in a real guard on the bundled example, one reading per stage. Not
covered: the ratios' values (timing belongs in benchmarks; the H200 readings are in
docs/PERFORMANCE.md).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "self_ratio_probe.py"


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--compiled"]], ids=["eager", "compiled"])
def test_the_probe_reads_one_ratio_per_stage(flags: list[str]) -> None:
    cmd = [sys.executable, str(SCRIPT), "--guards", "1", "--workloads", "1", *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for stage in ("screen", "full"):
        m = re.search(rf"^{stage}\s+median (\S+) over 1: (\S+)$", p.stdout, re.M)
        assert m, p.stdout
        assert math.isfinite(float(m.group(1))) and float(m.group(1)) > 0, p.stdout
