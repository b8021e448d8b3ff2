"""Guard benchmark for a GPU machine: correctness of the bundled and benchmark solutions,
repeatability of the medians, wall time of judging a 16-workload problem, and where a
candidate's time goes (process start, build, correctness, timing).

    python benchmarks/guard_bench.py --problems DIR [--repeats 5] [--out FILE.json]

DIR holds SOL-ExecBench problems (FlashInfer-Bench/025_rmsnorm_h4096 and
L1/025_video_latent_gelu_activation are used). Prints a short table last. With
nvidia-ml-py installed, the SM clock is sampled during every evaluation (min, median, max
per run are printed with the repeatability figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.guard.evaluator import Guard, GuardConfig  # noqa: E402
from kernelarc.problem.loader import load_problem, load_solution  # noqa: E402

EXAMPLES = ROOT / "src" / "kernelarc" / "examples"
SOLS = ROOT / "benchmarks" / "solutions"


class ClockSampler:
    """The GPU's SM clock, sampled by NVML every 20 ms while a ``with`` block runs (an
    unlocked clock is one suspect for run-to-run shifts of microsecond kernels); ``None``
    figures when nvidia-ml-py is not installed."""

    def __init__(self) -> None:
        self.mhz: list[int] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # reported in the summary, never fatal to the benchmark
            self._nvml, self.error = None, f"{type(e).__name__}: {e}"

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self.mhz.append(
                self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)
            )

    def __enter__(self) -> ClockSampler:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._nvml is not None:
            self._thread.join()

    def summary(self) -> list[int] | None:
        if not self.mhz:
            return None
        s = sorted(self.mhz)
        return [s[0], s[len(s) // 2], s[-1]]


def judge(problem_dir: Path, solutions: list[Path], **cfg: Any) -> list[dict[str, Any]]:
    problem = load_problem(problem_dir)
    out = []
    t0 = time.monotonic()
    with Guard(problem, GuardConfig(device="cuda", warm_spare=False, **cfg)) as guard:
        iso = guard.isolation.description
        for path in solutions:
            sol = load_solution(path)
            t1 = time.monotonic()
            with ClockSampler() as clocks:
                res = guard.evaluate(sol)
            out.append(
                {
                    "problem": problem.definition.name,
                    "solution": sol.name,
                    "statuses": [t.evaluation.status.value for t in res.traces],
                    "checks": [o.check for o in res.outcomes],
                    "first_failure": next(
                        (
                            t.evaluation.log[:400]
                            for t in res.traces
                            if t.evaluation.status.value != "PASSED"
                        ),
                        None,
                    ),
                    "latency_ms": [o.latency_ms for o in res.outcomes],
                    "iqm_ms": [(o.latency or {}).get("iqm_ms") for o in res.outcomes],
                    "timed_calls": [(o.latency or {}).get("n") for o in res.outcomes],
                    "median_interp_ms": [
                        (o.latency or {}).get("median_interp_ms") for o in res.outcomes
                    ],
                    "reference_ms": [o.reference_ms for o in res.outcomes],
                    "method": next((o.latency or {}).get("method") for o in res.outcomes),
                    "axes": [t.workload.axes for t in res.traces],
                    "phases_s": res.phases_s,
                    "eval_wall_s": time.monotonic() - t1,
                    "guard_wall_s": time.monotonic() - t0,
                    "isolation": iso,
                    "sm_clock_mhz_min_median_max": clocks.summary(),
                    "hardware": res.traces[0].evaluation.environment.hardware,
                    "libs": res.traces[0].evaluation.environment.libs,
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("guard_bench.json"))
    ap.add_argument("--only", default="examples,fib025,cuda,gelu,evil")
    ap.add_argument("--evil-glob", default="*", help="which tests/corpus/evil files to run")
    args = ap.parse_args()
    only = set(args.only.split(","))
    results: dict[str, Any] = {}
    fib = args.problems / "FlashInfer-Bench" / "025_rmsnorm_h4096"

    def save() -> None:
        args.out.write_text(json.dumps(results, indent=1, default=str))

    if "examples" in only:
        ex = EXAMPLES / "rmsnorm_h512"
        results["examples"] = judge(
            ex,
            [ex / "solution_pytorch.json", ex / "solution_triton.json", ex / "solution_cuda.json"],
        )
        save()
    if "fib025" in only:
        results["fib025_triton"] = [
            judge(fib, [SOLS / "rmsnorm_h4096" / "solution_triton.json"])[0]
            for _ in range(args.repeats)
        ]
        save()
    if "cuda" in only:
        results["fib025_cuda"] = [
            judge(fib, [SOLS / "rmsnorm_h4096" / "solution_cuda.json"])[0] for _ in range(2)
        ]
        save()
    if "gelu" in only:
        gelu = args.problems / "L1" / "025_video_latent_gelu_activation"
        results["gelu16"] = judge(gelu, [SOLS / "gelu_tanh" / "solution_pytorch.json"])
        save()
    if "evil" in only:
        corpus = ROOT / "tests" / "corpus" / "evil"
        files = sorted(corpus.glob(f"{args.evil_glob}.py")) if corpus.is_dir() else []
        results["evil"] = run_corpus(files)
        save()
    report(results)


def run_corpus(files: list[Path]) -> list[dict[str, Any]]:
    from kernelarc.problem.schema import Solution

    ex = load_problem(EXAMPLES / "rmsnorm_h512")
    rows = []
    with Guard(
        ex, GuardConfig(device="cuda", timeout=60, warmup=2, iterations=5, warm_spare=True)
    ) as guard:
        for f in files:
            text = f.read_text()
            head = {
                ln.split(":", 1)[0][2:].strip(): ln.split(":", 1)[1].strip()
                for ln in text.splitlines()
                if ln.startswith("# ") and ":" in ln
            }
            if head.get("problem", "rmsnorm_h512") != "rmsnorm_h512":
                continue
            sol = Solution.model_validate(
                {
                    "name": f.stem,
                    "definition": ex.definition.name,
                    "author": "corpus",
                    "spec": {
                        "languages": ["pytorch"],
                        "entry_point": f"{f.name}::run",
                        "destination_passing_style": head.get("dps", "true") != "false",
                    },
                    "sources": [{"path": f.name, "content": text}],
                }
            )
            res = guard.evaluate(sol, list(ex.workloads[:1]))
            ev = res.traces[0].evaluation
            got = ev.status.value + (f"[{res.outcomes[0].check}]" if res.outcomes[0].check else "")
            rows.append(
                {"file": f.name, "expect": head.get("expect"), "got": got, "log": ev.log[:200]}
            )
    return rows


def report(results: dict[str, Any]) -> None:
    print("\n== summary ==")
    for r in results.get("examples", []):
        print(
            f"example {r['solution']}: {r['statuses'].count('PASSED')}/{len(r['statuses'])} "
            f"passed, {r['eval_wall_s']:.1f}s {r['method']} {r['first_failure'] or ''}"
        )
    for key in ("fib025_triton", "fib025_cuda"):
        runs = results.get(key) or []
        if not runs:
            continue
        n = len(runs[0]["statuses"])
        passed = [r["statuses"].count("PASSED") for r in runs]
        print(
            f"{key}: passed {passed} of {n}; eval wall s "
            f"{[round(r['eval_wall_s'], 1) for r in runs]}; method {runs[0]['method']}"
        )
        phases = {k: round(v, 2) for k, v in runs[0]["phases_s"].items()}
        print(f"  phases run0 {json.dumps(phases)}")
        print(
            f"  SM clock MHz (min, median, max) per run: "
            f"{[r.get('sm_clock_mhz_min_median_max') for r in runs]}"
        )
        if len(runs) > 1 and all(p == n for p in passed):
            spreads = []
            for w in range(n):
                meds = [r["latency_ms"][w] for r in runs]
                spreads.append((max(meds) - min(meds)) / statistics.median(meds))
            print(
                f"  per-workload (max-min)/median over {len(runs)} runs: "
                f"max {max(spreads):.2%}, median {statistics.median(spreads):.2%}"
            )
            alt = (("iqm_ms", "interquartile mean"), ("median_interp_ms", "median between ticks"))
            for key, what in alt:
                rows = [[(r.get(key) or [None] * n)[w] for r in runs] for w in range(n)]
                if all(v is not None for row in rows for v in row):
                    sp = [(max(row) - min(row)) / statistics.median(row) for row in rows]
                    print(
                        f"  same for the {what}: max {max(sp):.2%}, "
                        f"median {statistics.median(sp):.2%}"
                    )
            for w in range(n):
                meds = [r["latency_ms"][w] for r in runs]
                calls = [(r.get("timed_calls") or [None] * n)[w] for r in runs]
                print(
                    f"   {runs[0]['axes'][w]} ours {statistics.median(meds) * 1e3:8.1f} µs "
                    f"ref {runs[0]['reference_ms'][w] * 1e3:8.1f} µs  spread "
                    f"{(max(meds) - min(meds)) / statistics.median(meds):.2%}  timed calls "
                    f"{calls}"
                )
    for r in results.get("gelu16", []):
        print(
            f"gelu 16 workloads: {r['statuses'].count('PASSED')}/16 passed, judged in "
            f"{r['eval_wall_s']:.1f}s (guard incl. start {r['guard_wall_s']:.1f}s) "
            f"phases {json.dumps({k: round(v, 2) for k, v in r['phases_s'].items()})}"
        )
    for r in results.get("evil", []):
        ok = (
            "ok "
            if r["expect"]
            and r["got"].startswith(r["expect"].split("[")[0])
            and ("[" not in r["expect"] or r["expect"] == r["got"])
            else "BAD"
        )
        print(f"{ok} {r['file']:40s} expect {r['expect']:30s} got {r['got']}")


if __name__ == "__main__":
    main()
