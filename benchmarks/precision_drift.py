"""How far the reference's own outputs move under TF32 matmuls, outside the guard.

    python benchmarks/precision_drift.py PROBLEM_DIR [--workload 0] [--device cuda]

Generates one workload's inputs (seed 0), runs the reference in float32 and again with
TF32 allowed, and prints per output the largest absolute difference and the fraction of
elements within the workload's tolerance — to tell a precision policy's real error from a
judging problem when the guard rejects it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.worker import normalize_outputs  # noqa: E402
from kernelarc.problem.inputs import generate_inputs, load_reference_module  # noqa: E402
from kernelarc.problem.loader import load_problem  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", type=Path)
    ap.add_argument("--workload", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import torch

    problem = load_problem(args.problem)
    d, wl = problem.definition, problem.workloads[args.workload]
    module = load_reference_module(d)
    names = list(d.outputs)
    gen = generate_inputs(d, wl, device=torch.device(args.device), seed=0,
                          problem_root=args.problem, reference_module=module)  # fmt: skip
    values = list(gen.values.values())
    torch.set_grad_enabled(False)
    ref = normalize_outputs(module.run(*values), len(names), names)
    ref = tuple(t.float().cpu() for t in ref)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    low = normalize_outputs(module.run(*values), len(names), names)
    tol = wl.tolerance
    print(f"{d.name} axes={wl.axes} atol={tol.max_atol} rtol={tol.max_rtol}")
    for name, a, b in zip(names, ref, low, strict=True):
        diff = (b.float().cpu() - a).abs()
        ok = (diff <= tol.max_atol + tol.max_rtol * a.abs()).float().mean().item()
        print(f"{name:24s} max|ref|={a.abs().max().item():.4g} "
              f"max|diff|={diff.max().item():.4g} within tolerance {ok:.4%}")  # fmt: skip


if __name__ == "__main__":
    main()
