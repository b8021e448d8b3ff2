"""``kernelarc status``: a run's budget, agents, incumbents, conclusions and best solution,
read back from its store (a table for people, ``--json`` for scripts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelarc.errors import KernelArcError
from kernelarc.orchestration.finish import run_status
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
    console.print(
        f"budget {summary.get('budget')}, evaluated {summary.get('evaluated')}, "
        f"passed {summary.get('passed')}, conclusions {summary.get('conclusions')}, "
        f"stopped: {summary.get('stopped')}"
    )
    judged = summary.get("workloads")
    if judged:
        console.print(
            f"[yellow]judged on {len(judged)} workloads only (--workloads): check the others "
            "with `kernelarc eval PROBLEM_DIR --solution <best>`[/]"
        )
    best = summary.get("best")
    if best:
        sp = best.get("speedup")
        console.print(
            f"best: {escape(str(best['path']))} ({best.get('candidate_id')}, "
            f"{'all workloads passed' if best.get('all_passed') else 'NOT all passed'}"
            + (f", {sp:.2f}× over the eager reference" if sp else "")
            + ")"
        )
        if best.get("is_reference"):
            console.print(
                "  (no candidate beat the reference: the best is the reference's own code, and "
                "its reading away from 1× is the measurement's noise on this machine)"
            )
    else:
        console.print("[red]no solution passed the full protocol[/]")


def status_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory of `kernelarc optimize`")],
    json_out: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
) -> None:
    """Budget, agents, incumbents, conclusions and the best solution of a run."""
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
        print_status(summary, Console())
