"""Guard.compare: interleaved timing of two solutions, each in several worker processes, and the
noise-aware decision (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Solution

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"

FAST = """
import torch
def run(hidden_states, weight, output):
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
"""
# The same result, with 300 redundant passes over the data: clearly slower (with 30, a
# loaded CI machine once read only 1.41x, within its noise).
SLOW = FAST.replace(
    "    x = hidden_states.float()\n",
    "    x = hidden_states.float()\n    for _ in range(300):\n        x = (x * 1.0).contiguous()\n",
)


def _solution(name: str, code: str) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "ka_rmsnorm_h512",
            "author": "test",
            "spec": {"languages": ["pytorch"], "entry_point": "s.py::run"},
            "sources": [{"path": "s.py", "content": code}],
        }
    )


@pytest.fixture(scope="module")
def guard():
    problem = load_problem(EXAMPLE)
    with Guard(problem, GuardConfig(device="cpu", warmup=2, iterations=24)) as g:
        yield g


def test_clearly_faster_is_better(guard: Guard) -> None:
    wl = [w for w in guard.problem.workloads if w.axes["batch_size"] >= 128][:1]
    decision = guard.compare(_solution("fast", FAST), _solution("slow", SLOW), wl, processes=3)
    assert decision.better, decision.reason
    assert decision.speedup > 1.5


def test_same_solution_is_not_better(guard: Guard) -> None:
    # Two processes of the same code once read 1.075x apart on a loaded CI machine, against
    # a within-process bar of 1.050: the bar now includes the spread between processes.
    wl = [w for w in guard.problem.workloads if w.axes["batch_size"] >= 128][:1]
    decision = guard.compare(_solution("a", FAST), _solution("b", FAST), wl)
    assert not decision.better, decision.reason
    assert decision.speedup < 1.01 or "4 + 4 processes" in decision.reason, decision.reason


def test_compare_needs_three_processes_per_side(guard: Guard) -> None:
    wl = guard.problem.workloads[:1]
    with pytest.raises(ValueError, match="at least 3 worker processes"):
        guard.compare(_solution("a", FAST), _solution("b", FAST), wl, processes=2)
