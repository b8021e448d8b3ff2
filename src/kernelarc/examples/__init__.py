"""KernelArc's own bundled example problems, in SOL-ExecBench format.

Each example is a problem directory (``definition.json``, ``workload.jsonl``, ``README.md``)
with example solutions beside it (``solution_*.json``, sources inline):

- ``rmsnorm_h512``: bf16 RMSNorm, hidden size 512; PyTorch, Triton and CUDA C++ solutions.
- ``gemm_small``: fp32 ``C = A @ B.T`` (N=64, K=128); an exact PyTorch solution and a TF32
  one that exists to exercise the guard's strict-precision check.

These are small enough for CPU tests. This module only locates the files; loading and
validating them is ``kernelarc.problem.loader``'s job.
"""

from __future__ import annotations

from pathlib import Path

from kernelarc.errors import KernelArcError

EXAMPLES_DIR = Path(__file__).resolve().parent


def example_names() -> list[str]:
    """Names of the bundled example problems (directories holding a definition.json)."""
    return sorted(p.parent.name for p in EXAMPLES_DIR.glob("*/definition.json"))


def example_dir(name: str) -> Path:
    """The directory of one bundled example problem."""
    path = EXAMPLES_DIR / name
    if not (path / "definition.json").is_file():
        raise KernelArcError(
            f"no bundled example problem named {name!r}; pick one of: {', '.join(example_names())}"
        )
    return path


def example_solutions(name: str) -> list[Path]:
    """The example solution files of one example problem, sorted by name."""
    return sorted(example_dir(name).glob("solution_*.json"))
