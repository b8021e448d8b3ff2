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
from collections.abc import Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "self_ratio_probe.py"


FLAGS = {"eager": [], "compiled": ["--compiled"]}


def _probe(flags: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--guards", "1", "--workloads", "1", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=500)


@pytest.fixture(scope="module")
def probes(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[Any]]]:
    """Both probes, started together (``_shared``'s ``started_ahead``): no value of a ratio
    is checked, only that one is read per stage."""
    name = "test_the_probe_reads_one_ratio_per_stage"
    yield from started_ahead(
        request, {f"{name}[{k}]": partial(_probe, flags) for k, flags in FLAGS.items()}
    )


@pytest.mark.slow
@pytest.mark.parametrize("which", list(FLAGS))
def test_the_probe_reads_one_ratio_per_stage(probes: dict[str, Future[Any]], which: str) -> None:
    p = probes[f"test_the_probe_reads_one_ratio_per_stage[{which}]"].result()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for stage in ("screen", "full"):
        m = re.search(rf"^{stage}\s+median (\S+) over 1: (\S+)$", p.stdout, re.M)
        assert m, p.stdout
        assert math.isfinite(float(m.group(1))) and float(m.group(1)) > 0, p.stdout
