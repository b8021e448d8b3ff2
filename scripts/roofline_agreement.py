"""Compare our B200 T_sol with SOL-ExecBench's published ``sol_ms`` (metadata.json).

Problems: FlashInfer-Bench ``gemm_*``, ``rmsnorm_*``, ``fused_add_rmsnorm_*`` and L2 problems
whose name contains ``decoder_layer``. Prints one markdown table: per problem, the median and
worst (furthest from 1) ratio ours/theirs, and how many workloads are within 10%, overall
and split by the term that bounds *our* T_sol.

    .venv/bin/python scripts/roofline_agreement.py [--convention solar|strict]
        [--device meta|cpu|cuda] [--problems DIR] [--only NAME_PART]
        [--detail NAME_PART]

The problem tree is ``--problems``, else ``$KERNELARC_PROBLEMS``, else ``../shared/problems``
beside the project.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from kernelarc.env import shared_problems
from kernelarc.problem.schema import Definition, Workload
from kernelarc.roofline.flops import count_workload
from kernelarc.roofline.profiles import B200
from kernelarc.roofline.score import compute_seconds, memory_seconds, t_sol_ms

TOLERANCE = 0.10


def problems_root(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    return shared_problems() or Path(__file__).resolve().parents[1] / ".." / "shared" / "problems"


def selected(root: Path) -> list[Path]:
    fib = sorted((root / "FlashInfer-Bench").glob("*"))
    keep = [p for p in fib if "_gemm_" in p.name or "rmsnorm_" in p.name]
    keep += [p for p in sorted((root / "L2").glob("*")) if "decoder_layer" in p.name]
    return [p for p in keep if (p / "metadata.json").is_file()]


def load(problem: Path) -> tuple[Definition, list[Workload], list[dict[str, Any]]]:
    definition = Definition.model_validate_json((problem / "definition.json").read_text())
    lines = (problem / "workload.jsonl").read_text().splitlines()
    workloads = [Workload.model_validate_json(line) for line in lines if line.strip()]
    meta = json.loads((problem / "metadata.json").read_text())["sol"]["per_workload"]
    if len(meta) != len(workloads):
        raise SystemExit(f"{problem}: {len(meta)} metadata entries, {len(workloads)} workloads")
    return definition, workloads, meta


#: metadata sol_ms is published with 4 decimals (0.1 us): the rounding allowed below.
ROUNDING_MS = 0.00005


def within(pair: tuple[float, float], rounding: bool = False) -> bool:
    ours, theirs = pair
    slack = ROUNDING_MS if rounding else 0.0
    return abs(ours - theirs) <= TOLERANCE * theirs + slack


def fmt_split(pairs: list[tuple[float, float]], rounding: bool = False) -> str:
    return f"{sum(within(p, rounding) for p in pairs)}/{len(pairs)}" if pairs else "-"


def compare(
    problem: Path, convention: str, device: str, detail: bool = False
) -> tuple[dict[str, list[tuple[float, float]]], list[str], int]:
    definition, workloads, meta = load(problem)
    pairs: dict[str, list[tuple[float, float]]] = {"compute": [], "memory": []}
    uncounted: list[str] = []
    for w, m in zip(workloads, meta, strict=True):
        if any(m["axes"].get(k) != v for k, v in w.axes.items()):
            raise SystemExit(f"{problem.name}: metadata entry {m['index']} axes differ")
        cost = count_workload(definition, w, device=device)  # type: ignore[arg-type]
        if cost.flops_by_class is None:
            uncounted.append(cost.reason or "unknown")
            continue
        ours, bound = t_sol_ms(cost, B200, convention=convention)  # type: ignore[arg-type]
        pairs[bound].append((ours, m["sol_ms"]))
        if detail:
            compute = compute_seconds(cost, B200, convention) * 1e6  # type: ignore[arg-type]
            memory = memory_seconds(cost, B200) * 1e6
            print(
                f"| {w.axes} | {compute:.2f} | {memory:.2f} | {ours * 1e3:.2f} | "
                f"{m['sol_ms'] * 1e3:.2f} | {ours / m['sol_ms']:.3f} |"
            )
    return pairs, uncounted, len(workloads)


def row(problem: Path, convention: str, device: str) -> str:
    pairs, uncounted, total = compare(problem, convention, device)
    every = pairs["compute"] + pairs["memory"]
    name = f"{problem.parent.name}/{problem.name}"
    if not every:
        why = uncounted[0].split("(", 1)[-1][:60] if uncounted else ""
        return f"| {name} | 0/{total} | - | - | - | - | - | - | not counted: {why} |"
    ratios = [o / t for o, t in every]
    worst = max(ratios, key=lambda r: abs(math.log(r)))
    return (
        f"| {name} | {len(every)}/{total} | {statistics.median(ratios):.3f} | "
        f"{worst:.3f} | {fmt_split(every)} | {fmt_split(every, True)} | "
        f"{fmt_split(pairs['compute'])} | {fmt_split(pairs['memory'])} | |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--convention", default="solar", choices=("solar", "strict"))
    parser.add_argument("--device", default="meta", choices=("meta", "cpu", "cuda"))
    parser.add_argument("--problems", default=None)
    parser.add_argument(
        "--only",
        default=None,
        metavar="NAME_PART",
        help="keep only the selected problems whose name contains this",
    )
    parser.add_argument(
        "--detail",
        default=None,
        metavar="NAME_PART",
        help="per-workload terms (us) of the selected problems matching this",
    )
    args = parser.parse_args(argv)
    root = problems_root(args.problems)
    problems = [p for p in selected(root) if not args.only or args.only in p.name]
    if not problems:
        print(f"no problems with metadata.json under {root}", file=sys.stderr)
        return 1
    if args.detail:
        for problem in (p for p in problems if args.detail in p.name):
            print(f"\n{problem.name} (us)\n\n| axes | compute | memory | ours | theirs | ratio |")
            print("|---|---|---|---|---|---|")
            compare(problem, args.convention, args.device, detail=True)
        return 0
    print(
        f"B200 profile, convention {args.convention}, counted on {args.device}; "
        f"ratio = our T_sol / metadata sol_ms; within = |ratio - 1| <= {TOLERANCE:.0%}; "
        f"'+rounding' also allows the {ROUNDING_MS * 1e3:.2f} us rounding of sol_ms\n"
    )
    print(
        "| problem | counted | median | worst | within | within +rounding "
        "| within, our compute-bound | within, our memory-bound | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for problem in problems:
        print(row(problem, args.convention, args.device), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
