"""Latency of the reference, its torch.compile and solutions on one workload, outside the guard.

    python benchmarks/plain_timing.py PROBLEM_DIR [SOLUTION.json ...] [--workload I]
        [--iterations 50] [--audit-hook]

A cross-check of the guard's timing in one plain process: inputs generated once (the guard's
generator, seed 0), per call an L2 flush, then CUDA events around the call alone, and the
host's wall time of call + synchronise; median of ``--iterations`` calls after 10 warm-ups.
``--audit-hook`` times everything a second time after installing an idle
``sys.addaudithook`` (the guard's workers run under one). No isolation, no correctness check,
no input pool: the numbers say what a call costs, not whether it is right. Only solutions
that return their outputs (not destination-passing) and build in-process (Python group).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.build import choose_builder, load_entry  # noqa: E402
from kernelarc.problem.inputs import generate_inputs, load_reference_module  # noqa: E402
from kernelarc.problem.loader import load_problem, load_solution  # noqa: E402


def time_one(
    fn: Callable[..., Any], args: list[Any], iterations: int, device: str
) -> tuple[float, float]:
    """(median event ms, median wall ms) of ``fn(*args)``, L2 flushed before every call
    (on a CPU device both are the wall time)."""
    import torch

    cuda = device.startswith("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    events, walls = [], []
    for i in range(10 + iterations):
        flush.fill_(i & 0xFF)
        sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        if cuda:
            start.record()
        fn(*args)
        if cuda:
            end.record()
        sync()
        wall = (time.perf_counter() - t0) * 1e3
        if i >= 10:
            events.append(start.elapsed_time(end) if cuda else wall)
            walls.append(wall)
    return statistics.median(events), statistics.median(walls)


def profile(fn: Callable[..., Any], args: list[Any], top: int) -> str:
    """torch.profiler's table of the top ``top`` operations over 5 calls (after the timing's
    warm-up): where a call's time goes, kernel by kernel."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with torch_profile(activities=activities) as prof:
        for _ in range(5):
            fn(*args)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    return str(prof.key_averages().table(sort_by=key, row_limit=top))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("solutions", type=Path, nargs="*")
    ap.add_argument("--workload", type=int, default=0, help="index in workload.jsonl")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--audit-hook", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", type=int, default=0, help="print the top N ops per call")
    args = ap.parse_args()
    import torch

    problem = load_problem(args.problem)
    wl = problem.workloads[args.workload]
    module = load_reference_module(problem.definition)
    sys.modules.setdefault(module.__name__, module)  # dynamo looks its globals up by name
    gen = generate_inputs(
        problem.definition, wl, device=args.device, seed=0, problem_root=problem.root
    )
    inputs = [gen.values[n] for n in problem.definition.inputs]
    calls: dict[str, Callable[..., Any]] = {
        "eager reference": module.run,
        "torch.compile (dynamic=False)": torch.compile(module.run, dynamic=False),
    }
    work = Path(tempfile.mkdtemp(prefix="plain-timing-"))
    for path in args.solutions:
        sol = load_solution(path)
        artifact = choose_builder(sol).build(
            sol, work_dir=work / sol.name, cache_dir=work / "cache", timeout=600
        )
        calls[f"{path.name}: {sol.name}"[:60]] = load_entry(artifact)
    print(f"{problem.definition.name}, workload {args.workload} {dict(wl.axes)}")
    rounds = [False, True] if args.audit_hook else [False]
    for hooked in rounds:
        if hooked:
            sys.addaudithook(lambda event, a: None)
        for name, fn in calls.items():
            ev, wall = time_one(fn, inputs, args.iterations, args.device)
            tag = " [audit hook]" if hooked else ""
            print(f"{name:62s} events {ev:9.4f} ms   wall {wall:9.4f} ms{tag}")
            if args.profile and not hooked:
                print(profile(fn, inputs, args.profile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
