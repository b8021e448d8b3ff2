"""A solution vs the eager reference vs torch.compile of the reference, in one guard session.

    python benchmarks/compile_baseline.py PROBLEM_DIR (SOLUTION.json | --bench
        agents_bench.json --key ID) [--out NEW.json] [--sample 0] [--budget S]
        [--workloads 3,8] [--cupti auto] [--device cuda]

The same protocol as the last step of ``optimizer_bench.py`` (``--sample`` workloads in its
spread order over the input sizes, 0 = all; ``--budget`` seconds at most), for a solution
judged earlier: a search whose call had no time left for the baseline, or one whose
baseline covered a sample only. Prints one row per workload and the geometric means.

With ``--bench`` the solution is the one that row ``--key`` of that ``agents_bench.json``
handed over (kept in the row) unless SOLUTION.json is given, and with ``--out`` the result
replaces the row's ``compile`` part in a copy written there (never over an existing file), with its
summary worked out again and ``compile_measured`` saying which code timed it when:
``optimizer_bench.py --merge`` then prints the table with this baseline. The row's search and
the baseline are then two runs; each ratio is still measured in one guard session.

``--extend`` times only the run's workloads the row's baseline does not yet cover (passed)
and adds them to it, so that several device calls cover a problem whose baseline is too
slow for one (``sessions`` lists each session's workloads, card, time and stop reason).
Each workload's ratio is still measured in one guard session; the geomean then spans
sessions, all on the card the row names (``gpu``): another card is refused, and a row written
before rows named their card needs ``--row-gpu`` (the card it is known to come from).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_table import device_name, summarize
from code_identity import code_content
from optimizer_bench import compile_baseline

from kernelarc.maths import geomean


def _check_row(bench: dict[str, Any], key: str) -> None:
    """Exit naming the rows there are when ``key`` is not one."""
    if key not in bench or not isinstance(bench[key], dict):
        sys.exit(f"--key {key}: not a row of --bench (its rows: {', '.join(sorted(bench))})")


def with_baseline(bench: dict[str, Any], key: str, res: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``bench`` whose row ``key`` has ``res`` as its baseline (and its summary
    worked out again)."""
    _check_row(bench, key)
    row = dict(bench[key])
    row["compile"] = res
    row["compile_measured"] = {
        "code_content": code_content(),
        "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    row["summary"] = summarize(key, row)
    return {**bench, key: row}


def passed(workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The baseline's workloads that give a ratio (both sides timed, passed)."""
    return [
        w
        for w in workloads
        if w["status"] == "PASSED" and w["latency_ms"] and w["compiled_ms"] and w["reference_ms"]
    ]


def to_extend(problem: Path, row: dict[str, Any]) -> tuple[list[str], int]:
    """The uuids of the run's workloads that ``row``'s baseline does not cover yet, and how
    many workloads the run has."""
    from kernelarc.problem.loader import load_problem

    loaded = load_problem(problem)
    pool = loaded.select([row["workloads"]]) if row.get("workloads") else loaded.workloads
    done = {w["uuid"] for w in passed((row.get("compile") or {}).get("workloads", []))}
    return [w.uuid for w in pool if w.uuid not in done], len(pool)


def check_card(row: dict[str, Any], row_gpu: str | None, here: str) -> None:
    """Exit unless ``row`` (or ``row_gpu``, for a row that names no card) comes from the card
    ``here``: a baseline extended on another card would mix two cards in one geomean."""
    named = row.get("gpu")
    if named is None and row_gpu is None:
        sys.exit(
            "--extend: the row does not name the card it was timed on (written before rows "
            f"named it); pass --row-gpu with that card's name if you know it (this is {here!r})"
        )
    if named is not None and row_gpu is not None and named != row_gpu:
        sys.exit(f"--extend: --row-gpu {row_gpu!r} but the row names {named!r}")
    card = named if named is not None else row_gpu
    if card != here:
        sys.exit(
            f"--extend: the row was timed on {card!r} and this is {here!r}; extend it on that "
            "card, or time a new baseline of all the workloads here"
        )


def extended(old: dict[str, Any], new: dict[str, Any], total: int) -> dict[str, Any]:
    """``old``'s passed workloads and ``new``'s as one baseline over ``total`` workloads."""
    kept = passed(old.get("workloads", []))

    def session(part: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if "sessions" in part:
            return list(part["sessions"])
        keys = ("gpu", "wall_s", "stopped")
        return [{"workloads": n, **{k: part.get(k) for k in keys}}]

    return {
        **new,
        "wall_s": float(old.get("wall_s") or 0.0) + new["wall_s"],
        "workloads": kept + new["workloads"],
        "planned": len(kept) + new["planned"],
        "of": total,
        "sessions": session(old, len(kept)) + session(new, len(new["workloads"])),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", type=Path)
    ap.add_argument("solution", type=Path, nargs="?", help="default: the --bench row's")
    ap.add_argument("--sample", type=int, default=0, help="workloads (0: all)")
    ap.add_argument("--budget", type=float, default=None, help="seconds at most (see above)")
    ap.add_argument("--workloads", default=None, help="only these (as optimize's --workloads)")
    ap.add_argument("--cupti", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bench", type=Path, default=None, help="an agents_bench.json")
    ap.add_argument("--key", default=None, help="the row of --bench (e.g. 002)")
    ap.add_argument("--out", type=Path, default=None, help="the updated copy of --bench")
    ap.add_argument(
        "--extend",
        action="store_true",
        help="time only the workloads the row's baseline does not cover and add them to it",
    )
    ap.add_argument(
        "--row-gpu",
        default=None,
        help="with --extend, for a row that does not name its card: the card it came from",
    )
    args = ap.parse_args()
    if args.extend and (args.out is None or args.workloads is not None):
        ap.error("--extend needs --bench, --key and --out, and chooses the workloads itself")
    bench: dict[str, Any] = {}
    if args.bench is not None:
        if args.key is None:
            ap.error("--bench needs --key")
        if args.out is not None and args.out.exists():
            ap.error(f"--out {args.out} exists: choose a new file")
        try:
            bench = json.loads(args.bench.read_text())
        except (OSError, json.JSONDecodeError) as e:
            ap.error(f"--bench {args.bench}: cannot read it: {e}")
        if not isinstance(bench, dict):
            ap.error(f"--bench {args.bench}: not an agents_bench.json (a JSON object by row)")
        _check_row(bench, args.key)  # a wrong --key fails now, not after the timing
    elif args.out is not None:
        ap.error("--out needs --bench and --key (the results it is a copy of)")
    if args.solution is None and args.bench is None:
        ap.error("give SOLUTION.json, or --bench and --key (the row's solution)")
    kept = None
    if args.solution is None:
        kept = ((bench.get(args.key) or {}).get("best") or {}).get("solution")
        if not isinstance(kept, dict) or "error" in kept:
            ap.error(
                "no SOLUTION.json given and the --bench row keeps no solution (rows written "
                f"before it kept them, or the run handed none over): {kept!r:.200}"
            )
    workloads, old, total = args.workloads, None, 0
    here = device_name(args.device)  # the card that times it, kept in the result
    if args.extend:
        old = bench[args.key].get("compile") or {}
        left, total = to_extend(args.problem, bench[args.key])
        if not left:
            sys.exit(f"--extend: the row's baseline covers all {total} workloads already")
        workloads = ",".join(left)
        check_card(bench[args.key], args.row_gpu, here)
        print(f"--extend: {len(left)} of {total} workloads to time", flush=True)
    with tempfile.TemporaryDirectory(prefix="kernelarc-baseline-") as tmp:
        solution = args.solution or Path(tmp) / "solution.json"
        if kept is not None:
            solution.write_text(json.dumps(kept))
        res = compile_baseline(
            args.problem, solution, args.sample, args.device, workloads, args.cupti,
            args.budget,
        )  # fmt: skip
    res["gpu"] = here
    print(json.dumps(res, indent=1, default=str))
    if old is not None:
        res = extended(old, res, total)
    if args.out is not None:
        args.out.write_text(json.dumps(with_baseline(bench, args.key, res), indent=1))
    ok = passed(res["workloads"])
    print(
        f"\n{'ours ms':>10s} {'eager ms':>10s} {'compile ms':>11s} "
        f"{'vs eager':>9s} {'vs compile':>11s}"
    )
    for w in ok:
        print(
            f"{w['latency_ms']:10.4f} {w['reference_ms']:10.4f} {w['compiled_ms']:11.4f} "
            f"{w['reference_ms'] / w['latency_ms']:8.2f}x "
            f"{w['compiled_ms'] / w['latency_ms']:10.2f}x"
        )
    ve = geomean([w["reference_ms"] / w["latency_ms"] for w in ok])
    vc = geomean([w["compiled_ms"] / w["latency_ms"] for w in ok])
    print(
        f"geomean over {len(ok)}/{res['of']} (planned {res['planned']}, stopped: "
        f"{res['stopped']}): vs eager {ve}, vs compile {vc}; wall {res['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
