"""One ``torch.compile(run, dynamic=False)`` of a problem's reference, timed in one process
with the guard's timer on the input placements of the guard's two workers (a diagnostic).

    python benchmarks/offset_probe.py PROBLEM_DIR [--workloads 4] [--rounds 4] [--cupti]
        [--eager]

Before session 24 the reference worker timed on ``placed`` inputs (small tensors copied to
offset 0 of an allocation of their own, large ones as generated) and the candidate worker
on inputs copied 64 elements into fresh allocations. Per workload, interleaved over
``--rounds``, this prints the medians of:

- ``old-ref``: a pool built the old reference way (its own allocations);
- ``cand``: a pool built the candidate way, 64 elements in (other allocations);
- ``same@0``: ``cand``'s very allocations, viewed at offset 0 — ``same@0`` against ``cand``
  is the offset alone, on the same pages; ``old-ref`` against ``cand`` adds which pages.

then the same after a no-op ``sys.addaudithook`` (the candidate worker runs with one), and
the GPU kernels of one call (``torch.profiler``): a call of several kernels has its host
launch gaps inside a CUPTI span. Ratios are ``x / cand``: below 1, ``cand`` is slower.
``--eager`` times the reference itself instead of its compile.

Not covered: the rest of the candidate worker (sentinel checks between calls, isolation);
``self_ratio_probe.py --compiled`` judges that pair through the guard.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.compile_pool import raise_recompile_limits  # noqa: E402
from kernelarc.guard.timing import placed, shifted_values, time_calls  # noqa: E402
from kernelarc.problem.inputs import generate_inputs, load_reference_module  # noqa: E402
from kernelarc.problem.loader import load_problem  # noqa: E402

POOL = 4  # distinct input sets per placement, as a small timing pool
SIDES = ("old-ref", "cand", "same@0")


def _time(fn: Any, pool: list[list[Any]], device: Any, cupti: bool) -> float:
    res = time_calls(
        lambda i: fn(*pool[i % len(pool)]),
        lambda i: None,
        warmup=10,
        iterations=200,
        device=device,
        use_cupti=cupti,
    )
    return float(res.summary()["median_ms"])


def _at_zero(values: list[Any]) -> list[Any]:
    import torch

    return [
        torch.as_strided(v, v.shape, v.stride(), 0) if isinstance(v, torch.Tensor) else v
        for v in values
    ]


def _kernels(fn: Any, args: list[Any]) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("--workloads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cupti", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script only")
    ap.add_argument("--eager", action="store_true", help="time the reference as it is")
    args = ap.parse_args()
    import torch
    import torch._dynamo

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("offset_probe: no CUDA device here (--device cpu checks the script)", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)  # as both guard workers do
    raise_recompile_limits(torch._dynamo.config)
    problem = load_problem(args.problem)
    module = load_reference_module(problem.definition)
    sys.modules[module.__name__] = module  # Dynamo imports a traced function's module
    fn = module.run if args.eager else torch.compile(module.run, dynamic=False)
    rows: list[tuple[str, str, dict[str, float]]] = []
    chosen = list(problem.workloads)[: args.workloads]
    pools: dict[str, dict[str, list[list[Any]]]] = {}
    for wl in chosen:

        def gen(seed: int, wl: Any = wl) -> list[Any]:
            g = generate_inputs(
                problem.definition, wl, device=device, seed=seed,
                problem_root=problem.root, reference_module=module,
            )  # fmt: skip
            return list(g.values.values())

        cand = [shifted_values(gen(s), 64) for s in range(POOL)]
        pools[wl.uuid] = {
            "old-ref": [placed(gen(s)) for s in range(POOL)],
            "cand": cand,
            "same@0": [_at_zero(entry) for entry in cand],
        }
        fn(*pools[wl.uuid]["old-ref"][0])  # compile this shape (or warm eager up)
        names = _kernels(fn, pools[wl.uuid]["cand"][0]) if device.type == "cuda" else []
        print(f"{wl.uuid[:8]}: {len(names)} kernel(s) per call: {', '.join(names)[:300]}")
    for phase in ("plain", "audit-hook"):
        if phase == "audit-hook":
            sys.addaudithook(lambda event, hook_args: None)
        for wl in chosen:
            got: dict[str, list[float]] = {side: [] for side in SIDES}
            for _ in range(args.rounds):
                for side in SIDES:
                    got[side].append(_time(fn, pools[wl.uuid][side], device, args.cupti))
            rows.append((phase, wl.uuid[:8], {k: statistics.median(v) for k, v in got.items()}))
    print(
        f"\n{'phase':10s} {'workload':8s} "
        + " ".join(f"{s + ' us':>11s}" for s in SIDES)
        + f" {'old-ref/cand':>12s} {'same@0/cand':>11s}"
    )
    for phase, uid, m in rows:
        print(
            f"{phase:10s} {uid:8s} "
            + " ".join(f"{m[s] * 1e3:11.3f}" for s in SIDES)
            + f" {m['old-ref'] / m['cand']:12.3f} {m['same@0'] / m['cand']:11.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
