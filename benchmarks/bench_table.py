"""The table of ``optimizer_bench.py``: a problem's summary from its results, the printed table
and its geomeans, and the merge of results of split device calls (``--merge``).

Columns: workloads correct; geomeans over the PASSED workloads of the speedup vs the eager
reference (the search's final judging), vs torch.compile (the compile baseline's own guard
session, ``(judged/all)``), vs torch.compile as the search judged it (``in search``:
``search_baseline.py``; the geomeans' last line takes, per problem, whichever of the two
covers every workload of the run), the fraction of the roofline bound of the card that
timed the row (all workloads / those whose bound is at least 20 us); the winner; wall and
device seconds; the workloads' bound types. Each row names its card (``gpu``): a line under
the table says which, or warns that the geomeans mix cards when the rows do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from code_identity import report_versions
from search_baseline import from_scores, vs_search_baseline

from kernelarc.maths import geomean

BIG_BOUND_MS = 0.020


def device_name(device: str) -> str:
    """The name of the card that ``device`` (``cuda``, ``cuda:1``, ``cpu``) times on, kept in
    each row: ratios and bound fractions hold for that card only."""
    if not device.startswith("cuda"):
        return device
    import torch

    return str(torch.cuda.get_device_name(torch.device(device)))


def summarize(name: str, r: dict[str, Any]) -> dict[str, Any]:
    per = (r.get("best") or {}).get("per_workload") or []
    ok = [w for w in per if w["status"] == "PASSED" and w["latency_ms"]]
    vs_eager = geomean([w["reference_ms"] / w["latency_ms"] for w in ok if w["reference_ms"]])
    frac = geomean([w["bound_ms"] / w["latency_ms"] for w in ok if w["bound_ms"]])
    big = [w for w in ok if (w["bound_ms"] or 0) >= BIG_BOUND_MS]
    frac_big = geomean([w["bound_ms"] / w["latency_ms"] for w in big])
    comp = [
        w
        for w in (r.get("compile") or {}).get("workloads", [])
        if w["status"] == "PASSED" and w["compiled_ms"] and w["latency_ms"]
    ]
    vs_compile = geomean([w["compiled_ms"] / w["latency_ms"] for w in comp])
    best = r.get("best") or {}
    in_search = vs_search_baseline(best.get("search_compile"))
    vs_search, search_n = geomean(in_search), len(in_search)
    scored = None if "search_compile" in best else from_scores(best)  # an older row
    if scored:
        vs_search, search_n = scored
    # the published figure, over every workload of the run: the search's own where it judged
    # the baseline in full on all of them, else the baseline session's where it did
    every = bool(per) and len(ok) == len(per)
    all_from = (
        "search"
        if every and vs_search and search_n == len(per)
        else "session"
        if every and len(comp) == len(per)
        else None
    )
    vs_all = {"search": vs_search, "session": vs_compile, None: None}[all_from]
    return {
        "problem": name,
        "gpu": r.get("gpu"),  # None: a row written before rows named their card
        "correct": (f"{len(ok)}/{len(per)}" if per else "no best")
        + (f" of {r['workloads_total']}" if r.get("workloads") else ""),
        "vs_eager": vs_eager,
        "vs_compile": vs_compile,
        "compile_n": len(comp),
        "compile_of": (r.get("compile") or {}).get("of"),
        "compile_skipped": bool((r.get("compile") or {}).get("skipped")),
        # the search's own judging of the same torch.compile baseline (search_baseline.py)
        "vs_compile_search": vs_search,
        "compile_search_n": search_n,
        "vs_compile_all": vs_all,
        "compile_all_from": all_from,
        "frac_bound": frac,
        "frac_bound_big": frac_big,
        "big_n": len(big),
        "winner": (r.get("best") or {}).get("agent"),
        "bound_types": r.get("bound_types"),
        "wall_s": r["optimize"]["wall_s"] + (r.get("compile") or {}).get("wall_s", 0.0),
        # device time: the guard judging the search's candidates, plus the compile baseline
        "device_s": float((r.get("best") or {}).get("judged_s") or 0.0)
        + float((r.get("compile") or {}).get("wall_s", 0.0)),
    }


def print_table(results: dict[str, Any]) -> None:
    rows = [r["summary"] for r in results.values() if "summary" in r]

    def f(x: float | None, pct: bool = False) -> str:
        return "-" if x is None else (f"{x:.1%}" if pct else f"{x:.2f}x")

    print(
        f"\n{'problem':8s} {'correct':>8s} {'vs eager':>9s} {'vs compile':>11s} "
        f"{'in search':>11s} {'bound':>7s} {'bound>=20us':>12s} {'winner':>12s} "
        f"{'wall s':>7s} {'device s':>8s}  bound type"
    )
    for s in rows:
        of = f"/{s['compile_of']}" if s.get("compile_of") else ""
        comp = (
            "(in search)"
            if s.get("compile_skipped")
            else f"{f(s['vs_compile'])} ({s['compile_n']}{of})"
        )
        searched = f"{f(s.get('vs_compile_search'))} ({s.get('compile_search_n', 0)})"
        print(
            f"{s['problem']:8s} {s['correct']:>8s} {f(s['vs_eager']):>9s} {comp:>11s} "
            f"{searched:>11s} "
            f"{f(s['frac_bound'], True):>7s} {f(s['frac_bound_big'], True):>12s} "
            f"{str(s['winner']):>12s} {s['wall_s']:7.0f} {s.get('device_s', 0.0):8.0f}  "
            + ", ".join(f"{k} {v}" for k, v in sorted((s.get("bound_types") or {}).items()))
        )
    print(
        f"geomean  vs eager {f(geomean([s['vs_eager'] or 0 for s in rows]))}, vs compile "
        f"{f(geomean([s['vs_compile'] or 0 for s in rows]))}, bound "
        f"{f(geomean([s['frac_bound'] or 0 for s in rows]), True)}; vs compile in search "
        f"{f(geomean([s.get('vs_compile_search') or 0 for s in rows]))} over "
        f"{sum(1 for s in rows if s.get('vs_compile_search'))} problems"
    )
    by_card: dict[str, list[str]] = {}
    for s in rows:
        by_card.setdefault(str(s.get("gpu") or "unrecorded"), []).append(s["problem"])
    if len(by_card) == 1:
        print(f"card: {next(iter(by_card))}")
    elif by_card:
        print(
            "WARNING: these rows come from different cards, so the geomeans mix them: "
            + "; ".join(f"{c}: {', '.join(ps)}" for c, ps in sorted(by_card.items()))
        )
    every = [s for s in rows if s.get("vs_compile_all")]
    print(
        f"vs compile over every workload of the run (in search, else the baseline session): "
        f"{f(geomean([s['vs_compile_all'] for s in every]))} over {len(every)}/{len(rows)} "
        "problems: "
        + (", ".join(f"{s['problem']} {s['compile_all_from']}" for s in every) or "none")
    )
    widest = [(s, *w) for s in rows if (w := widest_compile(s)) is not None]
    print(
        "vs compile, each problem's widest figure (in search over every workload, else the "
        f"baseline session's sample): {f(geomean([w[1] for w in widest]))} over "
        f"{len(widest)}/{len(rows)} problems: "
        + (", ".join(f"{s['problem']} {w} {n}" for s, _, w, n in widest) or "none")
    )


def widest_compile(s: dict[str, Any]) -> tuple[float, str, str] | None:
    """A summary row's speedup over torch.compile over the most workloads it has: (ratio,
    where from: ``search`` or the benchmark's own ``baseline`` session, workloads), or None
    when it has none."""
    if s.get("vs_compile_all"):
        searched = s.get("compile_all_from") == "search"
        n = s.get("compile_search_n") if searched else None
        return float(s["vs_compile_all"]), "search" if searched else "baseline", f"{n or 'all'}"
    if s.get("vs_compile_search"):
        return float(s["vs_compile_search"]), "search", str(s.get("compile_search_n"))
    if s.get("vs_compile"):
        of = f"/{s['compile_of']}" if s.get("compile_of") else ""
        return float(s["vs_compile"]), "baseline", f"{s.get('compile_n')}{of}"
    return None


def merge(files: list[Path]) -> dict[str, Any]:
    """The problems of several ``agents_bench.json`` files (the benchmark split over device
    calls); a problem in a later file replaces the same problem of an earlier one. A whole
    row's summary is worked out again with :func:`summarize`."""
    results: dict[str, Any] = {}
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"--merge: cannot read {path}: {e}")
        if not isinstance(data, dict):
            sys.exit(f"--merge: {path} is not an agents_bench.json (a JSON object by problem)")
        for key, r in data.items():
            if not isinstance(r, dict) or "summary" not in r:
                print(f"--merge: {path}: {key} has no summary (unfinished), left out")
                continue
            # worked out again from the row (older rows then get the newer columns too)
            results[key] = {**r, "summary": summarize(key, r)} if "optimize" in r else r
    report_versions(results)
    return results
