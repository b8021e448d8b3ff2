"""The optimizer benchmark: `kernelarc optimize` with the default built-in agents on a GPU.

    python benchmarks/optimizer_bench.py --problems ROOT [--only 007,002,...] [--budget 16]
        [--time-limit 240] [--compile-sample 0] [--compile-budget S] [--out DIR]
    python benchmarks/optimizer_bench.py --merge A/agents_bench.json B/agents_bench.json ...

For each problem (default: the six of ``SIX``) this runs the real CLI in a subprocess,
``kernelarc optimize PROBLEM --device cuda --budget B --time-limit T --json``, then reads
the run's store: the final full evaluation of ``best/solution.json`` gives, per workload,
the latency, the eager reference's latency (timed in the same guard session) and the
roofline bound of the card it ran on (each row names it: ``gpu``). torch.compile of the
reference (default options, ``dynamic=False``: the guard's baseline) is timed in one more
guard session on ``--compile-sample`` workloads spread over the input sizes (all by
default), as many as ``--compile-budget`` seconds allow: compiling per shape is what makes
it costly; the table says how many of the run's workloads it covers
(``compile_baseline.py`` times it again later for a saved solution). That session is left
out where the search itself judged the baseline in full on every workload of the run
(``--compile-session always`` keeps it as a cross-check). Results go to
``OUT/agents_bench.json`` after every step (the search, then the baseline), so a truncated
call keeps what finished. The table's ``in search`` column is the same baseline as the
search judged it (``search_baseline.py``: all workloads where it reached the full stage, no
device time of its own). "device s" is the time the guard spent judging candidates on the
device plus the compile baseline's session. ``--deadline S`` (seconds from the start) skips
the baseline and the problems that would start after it. SIGTERM stops the search in
progress (it hands over its best so far), saves its row and starts nothing more. Prints a
short table last (``bench_table.py``); ``--merge`` prints one table (and geomeans) over the
results of several calls, when the benchmark is split over device calls.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.evaluator import Guard, GuardConfig  # noqa: E402
from kernelarc.problem.inputs import estimate_input_bytes  # noqa: E402
from kernelarc.problem.loader import load_problem, load_solution  # noqa: E402
from kernelarc.store.sqlite import SQLiteStore  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_table import device_name, merge, print_table, summarize  # noqa: E402
from code_identity import code_content, code_tree_version, code_version  # noqa: E402
from search_baseline import baseline_in_search  # noqa: E402

SIX = {
    "007": "FlashInfer-Bench/007_gemm_n4096_k4096",
    "002": "FlashInfer-Bench/002_fused_add_rmsnorm_h4096",
    "L1-017": "L1/017_moe_expert_swiglu_with_down_projection_backward",
    "L2-002": "L2/002_decoder_layer_full_block",
    "Q-001": "Quant/001_fp8_attention_output_projection",
    "L2-025": "L2/025_moe_expert_parallel_execution_backward",
}


#: Why a row has no baseline session (``--compile-session needed``).
SEARCH_COVERS = "the search judged torch.compile's baseline in full on every workload of the run"


class Stop:
    """SIGTERM (e.g. from ``timeout``): the search in progress is told to stop
    (``kernelarc optimize`` then hands over its best so far), its row is saved, and no
    baseline session or further problem starts. The signal is passed on to the search, so a
    SIGTERM to this script alone stops it too. During the baseline session (in this
    process) the signal raises :class:`Stopped`: one workload of it can outlast the
    seconds between SIGTERM and SIGKILL, and a killed row would be lost."""

    def __init__(self) -> None:
        self.asked = False
        self.child: subprocess.Popen[str] | None = None
        self.in_baseline = False

    def __call__(self, signum: int, frame: object) -> None:
        self.asked = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
        if self.in_baseline:
            self.in_baseline = False  # once: the guard's cleanup then runs undisturbed
            raise Stopped("SIGTERM during the baseline session")


class Stopped(BaseException):
    """The baseline session was stopped by SIGTERM (its guard closes its workers). Not an
    ``Exception``: no handler on the way turns it into a verdict and goes on."""


def optimize(
    problem_dir: Path,
    run_dir: Path,
    budget: int,
    limit: float,
    agents: str | None,
    device: str,
    compile_workers: int = 0,
    workloads: str | None = None,
    cupti: str = "auto",
    stop: Stop | None = None,
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "kernelarc.cli.main",
        "optimize",
        str(problem_dir),
        "--device",
        device,
        "--budget",
        str(budget),
        "--time-limit",
        str(limit),
        "--run-dir",
        str(run_dir),
        "--json",
        *(["--agents", agents] if agents else []),
        *(["--compile-workers", str(compile_workers)] if compile_workers else []),
        *(["--workloads", workloads] if workloads else []),
        "--cupti",
        cupti,
    ]
    t0 = time.monotonic()
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    ) as proc:
        if stop is not None:
            stop.child = proc
            if stop.asked:  # the signal came before the search started
                proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate()
        finally:
            if stop is not None:
                stop.child = None
    wall = time.monotonic() - t0
    run_dir.mkdir(parents=True, exist_ok=True)  # absent when optimize failed at once
    (run_dir / "optimize.stderr.log").write_text(stderr)
    try:
        status = json.loads(stdout)
    except json.JSONDecodeError:
        status = {"error": f"exit {proc.returncode}"}
    return {
        "wall_s": wall,
        "exit": proc.returncode,
        "status": status,
        "stderr_tail": stderr[-3000:],
    }


def trajectory(store: SQLiteStore) -> list[dict[str, Any]]:
    """Every judged candidate: agent, stage, verdict, first failure, the agent's claim, and
    where the stage's time went (the guard's phases, from the run's evaluated events)."""
    claims = {c.candidate_id: c.claim for c in store.conclusions()}
    stages = {
        (str(e.payload.get("candidate")), name): st
        for e in store.events("evaluated")
        for name, st in dict(e.payload.get("stages") or {}).items()
    }
    rows = []
    for e in store.evaluations():
        bad = [r for r in e.result.per_workload if r.status != "PASSED"]
        rows.append(
            {
                "candidate": e.candidate_id,
                "agent": e.result.agent,
                "stage": e.stage,
                "passed": e.result.passed,
                "score": e.result.score,
                "stopped_early": e.result.stopped_early,
                "failure": (bad[0].status + ": " + bad[0].log[:1500]) if bad else None,
                "claim": claims.get(e.candidate_id),
                "wall_s": stages.get((e.candidate_id, e.stage), {}).get("wall_s"),
                "phases_s": stages.get((e.candidate_id, e.stage), {}).get("phases_s"),
            }
        )
    return rows


def judged_s(store: SQLiteStore) -> float:
    """Seconds the guard spent judging the agents' candidates (the sum of every stage's
    evaluation wall time): the device's share of the search, compile baseline excluded."""
    return sum(
        float(st.get("wall_s") or 0.0)
        for e in store.events("evaluated")
        for st in dict(e.payload.get("stages") or {}).values()
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return {"error": f"{path.name}: {type(e).__name__}: {e}"[:300]}


def best_results(run_dir: Path) -> dict[str, Any]:
    store = SQLiteStore(run_dir / "store.sqlite", readonly=True)
    events = store.events("best")
    if not events:
        return {"trajectory": trajectory(store), "judged_s": judged_s(store)}
    cid = str(events[-1].payload.get("candidate"))
    full = [e for e in store.evaluations(cid) if e.stage == "full"]
    cand = store.candidate(cid)
    agents = [(c.agent, c.id) for c in store.candidates()]
    per = full[-1].result.per_workload if full else ()
    # a confirmation (the chosen candidate judged again in a new process) names its parent
    confirms = events[-1].payload.get("confirms")
    origin = store.candidate(str(confirms)) if confirms else cand
    return {
        "candidate": cid,
        "agent": origin.agent if origin else None,
        "confirms": confirms,
        "confirmations": [e.payload for e in store.events("confirmation")],
        "parents": origin.parent_id if origin else None,
        "description": cand.solution.description if cand else "",
        # the handed-over solution itself: compile_baseline.py can time it again from here
        "solution": _read_json(run_dir / "best" / "solution.json"),
        "per_workload": [
            {
                "uuid": r.uuid,
                "axes": r.axes,
                "status": r.status,
                "latency_ms": r.latency_ms,
                "reference_ms": r.reference_ms,
                "bound_ms": r.bound_ms,
            }
            for r in per
        ],
        "candidates_by_agent": {a: sum(1 for x, _ in agents if x == a) for a, _ in agents},
        "judged_s": judged_s(store),
        "search_compile": baseline_in_search(store, str(confirms or cid)),
        "trajectory": trajectory(store),
    }


def spread_order(n: int) -> list[int]:
    """Indices ``0..n-1`` (workloads sorted by input size) in the order the compile baseline
    takes them: the median (``n // 2``), the smallest, the largest, then the middle of the
    widest stretch not yet taken, so that any prefix spreads over the sizes."""
    if n <= 0:
        return []
    order = [n // 2] + [i for i in (0, n - 1) if i != n // 2]
    while len(order) < n:
        taken = sorted(order)
        gaps = [(b - a, a, b) for a, b in zip(taken, taken[1:], strict=False) if b - a > 1]
        _, a, b = max(gaps, key=lambda g: (g[0], -g[1]))  # widest, then leftmost
        order.append((a + b) // 2)
    return order


def compile_baseline(
    problem_dir: Path,
    best: Path,
    sample: int,
    device: str,
    workloads: str | None = None,
    cupti: str = "auto",
    budget_s: float | None = None,
) -> dict[str, Any]:
    """The solution, the eager reference and torch.compile of the reference on ``sample``
    workloads (0: all) in :func:`spread_order` by input size, in one guard session.
    ``workloads``: the run's ``--workloads`` (the sample is taken from those); ``cupti``:
    the run's timer (the same clock on both sides of every ratio). ``budget_s``: no
    workload starts that would end after this many seconds, by the longest one so far (the
    first always runs): compiling per shape is what makes the baseline costly."""
    problem = load_problem(problem_dir)
    pool = problem.select([workloads]) if workloads else problem.workloads
    by_size = sorted(pool, key=lambda w: estimate_input_bytes(problem.definition, w))
    wls = [by_size[i] for i in spread_order(len(by_size))][: sample or None]
    cfg = GuardConfig(device=device, time_compiled_reference=True, warm_spare=False, cupti=cupti)
    t0 = time.monotonic()
    marks = [t0]

    def out_of_time(_: Any) -> str | None:
        marks.append(time.monotonic())
        steps = [b - a for a, b in zip(marks[1:], marks[2:], strict=False)] or [marks[1] - t0]
        if budget_s is not None and marks[-1] - t0 + max(steps) > budget_s:
            return f"budget: {budget_s:.0f} s would pass before the next workload's end"
        return None

    with Guard(problem, cfg) as guard:
        res = guard.evaluate(load_solution(best), wls, stop=out_of_time)
    out = []
    for o in res.outcomes:
        comp = (o.compiled_reference or {}).get("median_ms")
        out.append(
            {
                "uuid": o.workload.uuid,
                "status": o.status.value,
                "latency_ms": o.latency_ms,
                "reference_ms": o.reference_ms,
                "compiled_ms": comp,
                # where the baseline's time goes: its calls include compiling this shape
                "compiled_phases_s": (o.compiled_reference or {}).get("phases_s"),
                "notes": [n[:300] for n in o.notes],
            }
        )
    return {
        "wall_s": time.monotonic() - t0,
        "workloads": out,
        "planned": len(wls),
        "of": len(pool),
        "stopped": res.stopped_early,
        "phases_s": res.phases_s,
    }


def bound_types(
    problem_dir: Path, workloads: str | None = None, gpu: bool = False
) -> dict[str, int]:
    """How many workloads (the run's ``--workloads`` when given) are compute- or
    memory-bound on the profile of the card timing it (``gpu``; the H200's without:
    a dry run on the CPU) (``n/c``: the reference could not be counted; with
    ``gpu``, references that need real tensors are counted on the GPU, in a child process)."""
    from kernelarc.roofline.flops import count_workload
    from kernelarc.roofline.profiles import get_profile
    from kernelarc.roofline.score import t_sol_ms

    problem = load_problem(problem_dir)
    profile = get_profile("local-cuda" if gpu else "H200")
    kinds: dict[str, int] = {}
    for wl in problem.select([workloads]) if workloads else problem.workloads:
        cost = count_workload(problem.definition, wl, gpu_fallback=gpu)
        kind = "n/c" if cost.method == "none" else t_sol_ms(cost, profile)[1]
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=Path)
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="print the table of these agents_bench.json files (split runs) and exit",
    )
    ap.add_argument("--only", default=",".join(SIX))
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=240.0)
    ap.add_argument(
        "--compile-sample",
        type=int,
        default=0,
        help="workloads for the torch.compile baseline, spread over the input sizes (0: all; "
        "-1: no baseline)",
    )
    ap.add_argument(
        "--compile-budget",
        type=float,
        default=None,
        help="seconds for the baseline of each problem: no workload starts that would end "
        "after them (the first always runs); the table says (judged/all)",
    )
    ap.add_argument(
        "--compile-session",
        default="needed",
        choices=("needed", "always"),
        help="needed (default): no baseline session where the search judged torch.compile's "
        "baseline in full on every workload of the run (its 'in search' figure covers them "
        "all); always: the session in any case (a cross-check)",
    )
    ap.add_argument("--out", type=Path, default=Path("agents_bench"))
    ap.add_argument("--agents", default=None, help="passed to optimize (default: all)")
    ap.add_argument("--compile-workers", type=int, default=0, help="passed to optimize")
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a dry run)")
    ap.add_argument("--deadline", type=float, default=None, help="seconds for the whole script")
    ap.add_argument(
        "--workloads",
        default=None,
        help="passed to optimize: the search judges only these (indices or uuid prefixes, "
        "comma-separated); the table then says 'n/k of N'",
    )
    ap.add_argument(
        "--cupti",
        default="auto",
        choices=("auto", "on", "off"),
        help="the guard's timer, passed to optimize and used for the compile baseline",
    )
    ap.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="where the run directories go (default: --out); put them elsewhere when only a "
        "few files of the output folder can be kept",
    )
    args = ap.parse_args()
    if args.merge:
        print_table(merge(args.merge))
        return
    if args.problems is None:
        ap.error("--problems is required (or --merge FILE...)")
    t_start = time.monotonic()
    stop = Stop()
    signal.signal(signal.SIGTERM, stop)

    def late() -> bool:
        if stop.asked:
            return True
        return args.deadline is not None and time.monotonic() - t_start > args.deadline

    def save() -> None:  # whole or not at all: a signal may land in the middle
        path = args.out / "agents_bench.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(results, indent=1, default=str))
        os.replace(tmp, path)

    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for key in args.only.split(","):
        if late():
            print(
                f"{key}: not started, {'SIGTERM' if stop.asked else '--deadline passed'}",
                flush=True,
            )
            continue
        problem_dir = args.problems / SIX.get(key, key)
        # shallow: the run folder stays one level below --runs-dir
        run_dir = (args.runs_dir or args.out) / f"run-{key}"
        if run_dir.exists():
            sys.exit(
                f"{run_dir} exists (an earlier benchmark run): choose a fresh --out (or --runs-dir)"
            )
        r: dict[str, Any] = {
            "problem_dir": str(problem_dir),
            "code": code_version(),
            "code_tree": code_tree_version(),
            "code_content": code_content(),
            "gpu": device_name(args.device),
        }
        r["optimize"] = optimize(
            problem_dir,
            run_dir,
            args.budget,
            args.time_limit,
            args.agents,
            args.device,
            args.compile_workers,
            args.workloads,
            args.cupti,
            stop,
        )
        r["sigterm"] = stop.asked  # the search was stopped early: its row is partial
        r["cupti"] = args.cupti
        r["compile_workers"] = args.compile_workers
        r["workloads"] = args.workloads
        r["workloads_total"] = len(load_problem(problem_dir).workloads)
        results[key] = r
        try:
            r["bound_types"] = bound_types(
                problem_dir, args.workloads, args.device.startswith("cuda")
            )
        except Exception as e:  # the table then shows no bound type
            r["bound_types"] = {"error": 1}
            r["bound_types_error"] = f"{type(e).__name__}: {e}"[:500]
        if r["optimize"]["exit"] != 0 and not (run_dir / "best" / "solution.json").exists():
            tail = r["optimize"]["stderr_tail"].strip().splitlines()[-1:] or ["(no stderr)"]
            print(f"{key}: optimize failed (exit {r['optimize']['exit']}): {tail[0]}", flush=True)
            r["summary"] = summarize(key, r)
            save()
            continue
        r["best"] = best_results(run_dir)
        save()
        best = run_dir / "best" / "solution.json"
        if best.exists():  # beside agents_bench.json, where a copy of the results finds it
            (args.out / f"best-{key}.json").write_text(best.read_text())
        # the search judged the baseline in full on every workload: the table's figure
        if args.compile_session == "needed" and summarize(key, r)["compile_all_from"] == "search":
            r["compile"] = {"skipped": SEARCH_COVERS, "workloads": []}  # deadline or not
        elif late():
            why = "SIGTERM" if stop.asked else "--deadline passed"
            r["compile"] = {"error": f"skipped: {why}", "workloads": []}
        elif best.exists() and args.compile_sample >= 0:
            stop.in_baseline = True
            try:
                # the row as it stands, kept should this process be killed in the baseline
                r["summary"] = summarize(key, r)
                save()
                r["compile"] = compile_baseline(
                    problem_dir,
                    best,
                    args.compile_sample,
                    args.device,
                    args.workloads,
                    args.cupti,
                    args.compile_budget,
                )
            except (Exception, Stopped) as e:  # recorded: the table says "no compile baseline"
                r["compile"] = {"error": f"{type(e).__name__}: {e}"[:1000], "workloads": []}
            finally:
                stop.in_baseline = False
        r["summary"] = summarize(key, r)
        save()
        print(json.dumps(r["summary"], default=str), flush=True)
    print_table(results)


if __name__ == "__main__":
    main()
