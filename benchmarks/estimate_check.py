"""How well the judge's full-stage estimate fits compiled candidates, from kept results.

    python benchmarks/estimate_check.py benchmarks/results/2026-12-0[45]-*/[0LQ]*.json

For every candidate of the rows' trajectories whose claim says it compiles and which was
screened and then judged in full (passed, the run's workloads all judged), prints the ratio
estimate / measured full-stage seconds, for the screening scaled whole and for its
correctness phase counted once (``judge.full_cost_estimate`` with ``compile_once_s``), with
their ranges and medians. Rows that judged fewer workloads than the screening set has
(``--workloads``) are left out. No device needed: it reads the JSON only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernelarc.orchestration.judge import full_cost_estimate

SCREENED = 3  # the screening set's size in these runs (RunConfig.screen_workloads)


def pairs(path: Path) -> list[tuple[float, float]]:
    """(whole-scaled, compile-once) estimate / measured, per compiled candidate of a file."""
    out = []
    for row in json.loads(path.read_text()).values():
        best = row.get("best") or {}
        n, tr = len(best.get("per_workload") or []), best.get("trajectory") or []
        if n <= SCREENED:
            continue
        for t, nxt in zip(tr, tr[1:], strict=False):
            if not (t["stage"] == "screen" and nxt["candidate"] == t["candidate"]):
                continue
            if not (nxt["passed"] and nxt["wall_s"] and "compile" in (t.get("claim") or "")):
                continue
            once = (t.get("phases_s") or {}).get("correctness", 0.0)
            whole = full_cost_estimate(t["wall_s"], n, SCREENED)
            out.append(
                (
                    whole / nxt["wall_s"],
                    full_cost_estimate(t["wall_s"], n, SCREENED, once) / nxt["wall_s"],
                )
            )
    return out


def main() -> None:
    found = [p for f in sys.argv[1:] for p in pairs(Path(f))]
    if not found:
        sys.exit("no compiled candidate with both stages in these files")
    for name, xs in (
        ("scaled whole", sorted(a for a, _ in found)),
        ("compile once", sorted(b for _, b in found)),
    ):
        print(
            f"{name}: {len(xs)} candidates, estimate/measured {xs[0]:.2f}-{xs[-1]:.2f}, "
            f"median {xs[len(xs) // 2]:.2f}"
        )


if __name__ == "__main__":
    main()
