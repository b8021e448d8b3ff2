"""``benchmarks/exchange_cost.py`` on a machine without a GPU: it says it needs one and
exits 2 (its timings need CUDA IPC; they are a benchmark, run on the device)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "exchange_cost.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_bad_sizes_are_refused_by_name() -> None:
    r = _run("--outputs", "0")
    assert r.returncode == 2
    assert "--outputs and --repeat at least 1" in r.stderr


def test_without_cuda_it_says_so() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script would run its benchmark")
    r = _run("--gib", "0.001", "--outputs", "1", "--repeat", "1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs a CUDA GPU" in r.stderr
