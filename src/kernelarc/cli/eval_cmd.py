"""``kernelarc eval``: judge one solution on a problem's workloads with the guard."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelarc.cli.console import console
from kernelarc.guard.config import GuardConfig
from kernelarc.guard.evaluator import NOT_RUN, Guard
from kernelarc.guard.footprint import device_warnings
from kernelarc.maths import geomean
from kernelarc.problem.loader import load_problem, load_solution
from kernelarc.problem.schema import Trace
from kernelarc.roofline.bounds import workload_bounds
from kernelarc.roofline.score import sol_score


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f} µs" if v < 1 else f"{v:.3f} ms"


#: Printed workload ids are at least this long (or the whole uuid).
MIN_ID_CHARS = 8


def short_ids(uuids: Sequence[str], min_chars: int = MIN_ID_CHARS) -> dict[str, str]:
    """Each uuid's printed id: the shortest prefix length, at least ``min_chars``, at which
    every uuid's prefix names it alone (as ``--workloads PREFIX`` reads it: no other uuid
    starts with it, and it is not all digits, which reads as an index), or the whole
    uuid."""
    longest = max((len(u) for u in uuids), default=0)

    def names_one(prefix: str, uuid: str) -> bool:
        if prefix == uuid:
            return True
        if prefix.isascii() and prefix.isdigit():
            return False
        return sum(1 for u in uuids if u.startswith(prefix)) == 1

    for n in range(min_chars, longest + 1):
        ids = {u: u[:n] for u in uuids}
        if all(names_one(p, u) for u, p in ids.items()):
            return ids
    return {u: u for u in uuids}


class _TraceWriter:
    """Writes each trace as a JSON line as soon as its workload is judged, flushed, to the
    ``-o`` file (created at the first trace) and, with ``--json``, to stdout: a run killed
    midway keeps what was judged."""

    def __init__(self, output: Path | None, as_json: bool) -> None:
        self.output, self.as_json = output, as_json
        self._file: IO[str] | None = None

    def __call__(self, trace: Trace) -> None:
        line = trace.model_dump_json() + "\n"
        if self.output is not None:
            if self._file is None:
                self.output.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.output, "w")
            self._file.write(line)
            self._file.flush()
        if self.as_json:
            sys.stdout.write(line)
            sys.stdout.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _bounds(
    problem: Any, workloads: list[Any], device: str, profile_name: str | None, err: Console
) -> dict[str, float]:
    """T_sol per workload (ms) for the chosen profile; empty when it cannot be computed."""
    bounds, warnings = workload_bounds(problem.definition, workloads, device, profile_name)
    for w in warnings:
        err.print(f"[yellow]{escape(w)}[/]")
    return bounds


def eval_command(
    problem_dir: Annotated[
        Path,
        typer.Argument(
            help="problem directory (definition.json + workload.jsonl) or a definition.json"
        ),
    ],
    solution: Annotated[Path, typer.Option("--solution", "-s", help="solution.json")],
    device: Annotated[str, typer.Option(help="auto, cpu or cuda[:N]")] = "auto",
    timeout: Annotated[float, typer.Option(help="seconds per workload")] = 300.0,
    workloads: Annotated[
        list[str] | None,
        typer.Option(
            "--workloads",
            "-w",
            help="uuid, uuid prefix or index; repeatable or comma-separated; '!X' leaves X "
            "out (of all workloads when only left-out ones are given)",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="write the trace JSONL here, each as judged"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print traces as JSON lines")] = False,
    strict_precision: Annotated[
        bool,
        typer.Option(
            "--strict-precision",
            help="reject solutions that lower precision (TF32, bf16 compute) even if tolerated",
        ),
    ] = False,
    rounds: Annotated[int, typer.Option(help="correctness rounds per workload")] = 10,
    warmup: Annotated[int, typer.Option(help="untimed warm-up calls")] = 10,
    iterations: Annotated[int, typer.Option(help="timed calls per workload")] = 50,
    seed: Annotated[int, typer.Option(help="base seed of the input protocol")] = 200,
    compile_baseline: Annotated[
        bool, typer.Option("--compile-baseline", help="also time torch.compile of the reference")
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            help="roofline profile for the bound (h100, h200, b200, cpu; default: this device)"
        ),
    ] = None,
    cupti: Annotated[str, typer.Option(help="auto, on or off")] = "auto",
    baseline: Annotated[
        str,
        typer.Option(
            help="baseline of the SOL score: eager (the reference here), compile (torch.compile "
            "of the reference here; implies --compile-baseline) or leaderboard (the B200 "
            "baseline and bound from metadata.json)"
        ),
    ] = "eager",
    force: Annotated[
        bool,
        typer.Option("--force", help="judge a solution written for another problem"),
    ] = False,
) -> None:
    """Judge SOLUTION on PROBLEM_DIR: correctness (official rules and extra defences),
    timing, reward-hack checks. Exit code 0 only when every workload passed."""
    err = console(stderr=True)
    if baseline not in ("eager", "compile", "leaderboard"):
        err.print(f"[red]error:[/] --baseline {baseline!r}: use eager, compile or leaderboard")
        raise typer.Exit(2)
    code = _run(
        problem_dir,
        solution,
        device,
        timeout,
        workloads,
        output,
        as_json,
        strict_precision,
        rounds,
        warmup,
        iterations,
        seed,
        compile_baseline or baseline == "compile",
        profile,
        cupti,
        baseline,
        force,
        err,
    )
    raise typer.Exit(code)


def _run(
    problem_dir: Path,
    solution_path: Path,
    device: str,
    timeout: float,
    workloads: list[str] | None,
    output: Path | None,
    as_json: bool,
    strict: bool,
    rounds: int,
    warmup: int,
    iterations: int,
    seed: int,
    compile_baseline: bool,
    profile: str | None,
    cupti: str,
    baseline: str,
    force: bool,
    err: Console,
) -> int:
    problem = load_problem(problem_dir)
    sol = load_solution(solution_path)
    if sol.definition != problem.definition.name:
        mismatch = (
            f"{solution_path} is a solution of {sol.definition!r}, not of "
            f"{problem.definition.name!r}"
        )
        if not force:
            err.print(
                f"[red]error:[/] {escape(mismatch)}: judge it on its own problem, or pass --force"
            )
            return 2
        err.print(f"[yellow]warning:[/] {escape(mismatch)} (judged anyway: --force)")
    chosen = problem.select(workloads) if workloads else list(problem.workloads)
    for note in problem.notes:
        err.print(f"[dim]note: {escape(note)}[/]")
    cfg = GuardConfig(
        device=device,
        timeout=timeout,
        rounds=rounds,
        warmup=warmup,
        iterations=iterations,
        seed=seed,
        strict_precision=strict,
        time_compiled_reference=compile_baseline,
        cupti=cupti,
        warm_spare=False,
    )
    with Guard(problem, cfg) as guard:
        err.print(
            f"judging {escape(sol.name)} on {escape(problem.definition.name)}: "
            f"{len(chosen)} workloads, device {guard.device}, "
            f"isolation: {guard.isolation.description}"
        )
        for w in device_warnings(problem.definition, chosen, guard.device):
            err.print(f"[yellow]{escape(w)}[/]")
        writer = _TraceWriter(output, as_json)
        try:
            result = guard.evaluate(sol, chosen, on_trace=writer)
        finally:
            writer.close()
        dev = guard.device
    if not as_json:
        bounds = _bounds(problem, chosen, dev, profile, err)
        scores = _scores(problem, result, bounds, baseline, err)
        out = console()
        ids = short_ids([w.uuid for w in problem.workloads])
        _table(result, bounds, scores, baseline, ids, out)
    passed = sum(1 for t in result.traces if t.evaluation and t.evaluation.status.value == "PASSED")
    err.print(
        f"{passed}/{len(result.traces)} workloads passed in {result.wall_s:.1f} s "
        f"(phases: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.phases_s.items()) + ")"
    )
    skipped = sum(1 for o in result.outcomes if o.log.startswith(NOT_RUN))
    if skipped:
        err.print(
            f"{skipped} workloads not run: {escape(result.stopped_early or '')} (a solution "
            "that hangs is judged on one time limit, not one per workload)"
        )
    if output is not None:
        err.print(f"traces written to {output}")
    return 0 if result.all_passed else 1


def _scores(
    problem: Any, result: Any, bounds: dict[str, float], baseline: str, err: Console
) -> dict[str, float]:
    """SOL score per workload (0 for a failed workload), with the chosen baseline."""
    meta_rows: dict[str, dict[str, Any]] = {}
    if baseline == "leaderboard":
        rows = ((problem.metadata or {}).get("sol") or {}).get("per_workload") or []
        index = {w.uuid: i for i, w in enumerate(problem.workloads)}
        if len(rows) != len(problem.workloads):
            err.print(
                "[yellow]no leaderboard baseline: metadata.json lacks per-workload "
                "figures matching workload.jsonl[/]"
            )
            return {}
        meta_rows = {u: rows[i] for u, i in index.items()}
        err.print("[dim]note: leaderboard baseline and bound are B200 figures[/]")
    out: dict[str, float] = {}
    for o in result.outcomes:
        uuid = o.workload.uuid
        if o.status.value != "PASSED" or o.latency_ms is None:
            out[uuid] = 0.0
            continue
        if baseline == "leaderboard":
            row = meta_rows.get(uuid, {})
            t_b, t_sol = row.get("baseline_latency_ms"), row.get("sol_ms")
        else:
            t_sol = bounds.get(uuid)
            ref = o.compiled_reference if baseline == "compile" else o.reference
            t_b = None if ref is None else ref.get("median_ms")
        if t_b is None or t_sol is None:
            continue
        out[uuid] = sol_score(float(o.latency_ms), float(t_sol), float(t_b))
    return out


def _table(
    result: Any,
    bounds: dict[str, float],
    scores: dict[str, float],
    baseline: str,
    ids: dict[str, str],
    console: Console,
) -> None:
    table = Table(title=f"{result.solution}")
    for col in (
        "#",
        "workload",
        "axes",
        "status",
        "latency",
        "reference",
        "speedup",
        "of bound",
        "SOL score",
        "max abs err",
        "max rel err",
    ):
        table.add_column(
            col, justify="right" if col not in ("workload", "axes", "status") else "left"
        )
    speedups, fracs = [], []
    for i, (trace, o) in enumerate(zip(result.traces, result.outcomes, strict=True)):
        e = trace.evaluation
        status = e.status.value + (f"[{o.check}]" if o.check else "")
        color = "green" if status == "PASSED" else "red"
        lat, ref = o.latency_ms, o.reference_ms
        sp = (ref / lat) if lat and ref else None
        bound = bounds.get(trace.workload.uuid)
        frac = (bound / lat) if bound and lat else None
        if sp:
            speedups.append(sp)
        if frac:
            fracs.append(frac)
        c = e.correctness
        table.add_row(
            str(i),
            ids.get(trace.workload.uuid, trace.workload.uuid),
            " ".join(f"{k}={v}" for k, v in trace.workload.axes.items()),
            f"[{color}]{escape(status)}[/]",
            _fmt_ms(lat),
            _fmt_ms(ref),
            f"{sp:.2f}×" if sp else "-",
            f"{frac:.0%}" if frac else "-",
            f"{scores[trace.workload.uuid]:.3f}" if trace.workload.uuid in scores else "-",
            f"{c.max_absolute_error:.2e}" if c else "-",
            f"{c.max_relative_error:.2e}" if c else "-",
        )
    console.print(table)
    for trace in result.traces:
        e = trace.evaluation
        if e.status.value != "PASSED":
            first = e.log.strip().splitlines()[0] if e.log.strip() else ""
            wid = ids.get(trace.workload.uuid, trace.workload.uuid)
            head = escape(f"{wid} {e.status.value}")
            console.print(f"[red]{head}[/]: {escape(first[:300])}")
    gm = geomean(speedups)
    if gm is not None:
        line = f"geomean speedup vs eager reference: {gm:.2f}× over {len(speedups)} workloads"
        gf = geomean(fracs)
        if gf is not None:
            line += f"; geomean fraction of bound: {gf:.1%}"
        console.print(line)
    vs_compile = [
        o.compiled_reference["median_ms"] / o.latency_ms
        for o in result.outcomes
        if o.compiled_reference and o.latency_ms
    ]
    gm = geomean(vs_compile)
    if gm is not None:
        console.print(
            f"geomean speedup vs torch.compile of the reference: {gm:.2f}× over "
            f"{len(vs_compile)} workloads"
        )
    if scores and len(scores) == len(result.traces):
        mean = sum(scores.values()) / len(scores)
        console.print(f"mean SOL score ({baseline} baseline, failed workloads count 0): {mean:.3f}")
