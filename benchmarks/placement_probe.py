"""Does where a tiny kernel's tensors live in device memory move its latency?

    python benchmarks/placement_probe.py [--rows 15,34,64] [--placements 12] [--iterations 300]

Issue 2's last miss: the ~2.3 µs workloads of FIB 025 (RMSNorm, 4096 bf16 per row) repeat
within 2.6-2.9% across guard evaluations, whole runs sitting ~60 ns apart, while each run
times up to 1000 calls. One suspect is per-process placement: every input set of a run's
timing pool comes from the same few caching-allocator segments, so all its calls read the
same physical pages. This probe times the benchmark's Triton RMSNorm (the guard's own
timing loop: CUPTI spans when importable, L2 flushed before every call) with its tensors
carved out of ``--placements`` separate 64 MiB allocations, each kept alive so that every
placement has its own memory, then once more on the first placement (drift within the
process), then rotating over all placements call by call. If the per-placement medians
spread about as much as whole evaluations do, placement explains the spread, and a timing
pool spread over several allocations would average it out.

``--flush-placements K`` then keeps the tensors on the first placement and moves the L2
flush buffer instead (the timing loop allocates it afresh for every loop; a kept 160 MiB
spacer before each loop makes the next one land elsewhere): the flush leaves the L2 full
of that buffer's dirty lines, which the kernel's misses evict, so its placement may matter
too (a suspect for what still differs between processes once the pool is spread). Prints a
short table last.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.timing import time_calls  # noqa: E402

SOL = ROOT / "benchmarks" / "solutions" / "rmsnorm_h4096" / "rmsnorm_triton.py"
HIDDEN = 4096
ARENA = 64 << 20


def _kernel():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rmsnorm_triton", SOL)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run


def _carve(arena, rows: int, gen):  # type: ignore[no-untyped-def]
    """x, w, y as views of one arena at 64 KiB-aligned offsets, x and w random."""
    import torch

    n = rows * HIDDEN * 2
    step = (n + 65535) // 65536 * 65536
    x = arena[0:n].view(torch.bfloat16).view(rows, HIDDEN)
    w = arena[step : step + HIDDEN * 2].view(torch.bfloat16)
    y = arena[2 * step : 2 * step + n].view(torch.bfloat16).view(rows, HIDDEN)
    x.copy_(torch.randn(rows, HIDDEN, generator=gen, device=arena.device).to(torch.bfloat16))
    w.copy_(torch.randn(HIDDEN, generator=gen, device=arena.device).to(torch.bfloat16))
    return x, w, y


def _time(run, sets, iterations: int, cupti: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    import torch

    def before(i: int) -> None:
        sets[i % len(sets)][2].fill_(float("nan"))

    res = time_calls(
        lambda i: run(*sets[i % len(sets)]),
        before,
        warmup=10,
        iterations=iterations,
        device=torch.device("cuda"),
        use_cupti=cupti,
    )
    s = res.summary()
    return {"median_us": s["median_ms"] * 1e3, "iqm_us": s["iqm_ms"] * 1e3, "method": s["method"]}


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="15,34,64")
    ap.add_argument("--placements", type=int, default=12)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--no-cupti", action="store_true")
    ap.add_argument("--flush-placements", type=int, default=0)
    a = ap.parse_args()
    cupti = not a.no_cupti
    run = _kernel()
    gen = torch.Generator(device="cuda").manual_seed(0)
    arenas = [torch.empty(ARENA, dtype=torch.uint8, device="cuda") for _ in range(a.placements)]
    table: list[dict[str, Any]] = []
    for rows in [int(r) for r in a.rows.split(",")]:
        sets = [_carve(arena, rows, gen) for arena in arenas]
        per = [_time(run, [s], a.iterations, cupti) for s in sets]
        again = _time(run, [sets[0]], a.iterations, cupti)
        rot = _time(run, sets, a.iterations * 2, cupti)
        meds = [p["median_us"] for p in per]
        iqms = [p["iqm_us"] for p in per]
        mid = statistics.median(meds)
        line: dict[str, Any] = {
            "rows": rows,
            "method": per[0]["method"],
            "placement_medians_us": [round(m, 4) for m in meds],
            "placement_iqms_us": [round(m, 4) for m in iqms],
            "spread_median_pct": 100 * (max(meds) - min(meds)) / mid,
            "spread_iqm_pct": 100 * (max(iqms) - min(iqms)) / statistics.median(iqms),
            "first_again_us": again["median_us"],
            "first_again_iqm_us": again["iqm_us"],
            "rotating_median_us": rot["median_us"],
            "rotating_iqm_us": rot["iqm_us"],
        }
        if a.flush_placements:
            spacers = []
            flush = []
            for _ in range(a.flush_placements):
                flush.append(_time(run, [sets[0]], a.iterations, cupti)["median_us"])
                spacers.append(torch.empty(160 << 20, dtype=torch.uint8, device="cuda"))
            line["flush_placement_medians_us"] = [round(m, 4) for m in flush]
            line["flush_spread_pct"] = 100 * (max(flush) - min(flush)) / statistics.median(flush)
            del spacers
        print(line, flush=True)
        table.append(line)
    print(f"\n{'rows':>5} {'timer':>7} {'med min':>8} {'med max':>8} {'spread%':>8} "
          f"{'iqm spr%':>8} {'p0 again':>9} {'rot med':>8} {'rot iqm':>8}")  # fmt: skip
    for t in table:
        meds = t["placement_medians_us"]
        print(f"{t['rows']:>5} {t['method'][:7]:>7} {min(meds):8.4f} {max(meds):8.4f} "
              f"{t['spread_median_pct']:8.2f} {t['spread_iqm_pct']:8.2f} "
              f"{t['first_again_us']:9.4f} {t['rotating_median_us']:8.4f} "
              f"{t['rotating_iqm_us']:8.4f}")  # fmt: skip
    for t in table:
        if "flush_placement_medians_us" in t:
            fl = t["flush_placement_medians_us"]
            print(f"rows {t['rows']}: flush buffer moved {len(fl)} times, tensors fixed: "
                  f"{min(fl):.4f}-{max(fl):.4f} us ({t['flush_spread_pct']:.2f}%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
