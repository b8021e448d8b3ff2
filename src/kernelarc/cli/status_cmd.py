"""``kernelarc status``: a run's budget, agents, incumbents, conclusions, the solution it
handed over (or why none), whether it is finished, running or stopped, and for how long,
read back from its store (a table for people, ``--json`` for scripts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelarc.cli.console import console
from kernelarc.env import prog
from kernelarc.errors import KernelArcError
from kernelarc.orchestration.finish import NO_GAIN, run_status
from kernelarc.store.sqlite import SQLiteStore


def print_status(summary: dict[str, Any], console: Console) -> None:
    table = Table(title=f"run: {summary.get('problem')}")
    for col in ("agent", "strategy", "candidates", "conclusions", "incumbent", "score"):
        table.add_column(col)
    for a in summary.get("agents", []):
        inc = a.get("incumbent") or {}
        table.add_row(
            a["name"],
            str(a.get("strategy") or "-"),
            str(a["candidates"]),
            str(a["conclusions"]),
            str(inc.get("candidate_id") or "-"),
            f"{inc['score']:.2f}×" if inc.get("score") else "-",
        )
    console.print(table)
    console.print(_counts(summary))
    broken = summary.get("reference_broken")
    if broken:
        console.print(
            f"[red]the reference is broken: {escape(str(broken))}[/] (it fails on every "
            f"screened workload; fix the problem's reference, `{prog()} eval PROBLEM_DIR` "
            "runs it, and run again)"
        )
    best = summary.get("best")
    judged = summary.get("workloads")
    if judged and best:
        console.print(
            f"[yellow]judged on {len(judged)} workloads only (--workloads): check the others "
            f"with `{prog()} eval PROBLEM_DIR --solution {escape(str(best['path']))}`[/]"
        )
    if best:
        _print_best(best, console)
    elif summary.get("state") == "running":
        console.print("[yellow]no solution handed over yet: the run is still going[/]")
    elif summary.get("state") == "stopped":
        console.print(
            "[yellow]no solution handed over: the run stopped before its end (killed, or "
            f"cut); `{prog()} optimize PROBLEM_DIR --run-dir RUN_DIR --resume` finishes it[/]"
        )
    elif not broken:
        console.print("[red]no solution passed the full protocol[/]")


def _counts(summary: dict[str, Any]) -> str:
    """The budget and what was judged: by the search, and at the end (the composition, the
    confirmations, the reference judged again), then the run's state and elapsed time."""
    end = summary.get("judged_at_end") or 0
    state = summary.get("state")
    elapsed = summary.get("elapsed_s")
    took = "" if elapsed is None else f" after {_duration(float(elapsed))}"
    return (
        f"budget {summary.get('budget')}, evaluated {summary.get('evaluated')}"
        + (f" (+{end} judged at the end)" if end else "")
        + f", passed {summary.get('passed')}, conclusions {summary.get('conclusions')}, "
        f"stopped: {summary.get('stopped')}" + (f"; {state}{took}" if state else "")
    )


def _print_best(best: dict[str, Any], console: Console) -> None:
    sp = best.get("speedup")
    if best.get("is_reference"):
        console.print(
            f"best: {escape(str(best['path']))} (the reference itself, "
            f"{best.get('candidate_id')}): {NO_GAIN}"
        )
        if sp:
            console.print(
                f"  (it read {sp:.2f}× of itself: the measurement's noise on this machine)"
            )
        return
    origin = f", the confirmation of {best['confirms']}" if best.get("confirms") else ""
    console.print(
        f"best: {escape(str(best['path']))} ({best.get('candidate_id')} of agent "
        f"{best.get('agent')}{origin}, "
        f"{'all workloads passed' if best.get('all_passed') else 'NOT all passed'}"
        + (f", {sp:.2f}× over the eager reference" if sp else "")
        + ")"
    )
    slower = best.get("slower_workloads") or []
    if slower:
        named = ", ".join(
            f"{escape(_axes(s))} ({s['speedup']:.2f}×)" for s in slower if s.get("speedup")
        )
        console.print(f"[yellow]slower than the reference on {len(slower)} workload(s): {named}[/]")


def _axes(workload: dict[str, Any]) -> str:
    axes = workload.get("axes") or {}
    return ", ".join(f"{k}={v}" for k, v in axes.items()) or str(workload.get("uuid"))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 120:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def status_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory of `kernelarc optimize`")],
    json_out: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
) -> None:
    """Budget, agents, incumbents, conclusions, the handed-over solution and the state of a
    run (finished, running or stopped)."""
    path = run_dir / "store.sqlite"
    if not path.exists():
        raise KernelArcError(f"{run_dir} is not a run directory (no store.sqlite)")
    store = SQLiteStore(path, readonly=True)
    try:
        summary = run_status(store, run_dir)
    finally:
        store.close()
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_status(summary, console())
