"""``kernelarc problems ROOT [--json]``: list every problem under ROOT and whether it loads.

The table shows name, subset, workload count, axes, dtypes and status, followed by the load
errors and a summary line. ``--json`` writes only a JSON list (one object per problem,
``error`` null when it loads) to stdout; the summary goes to stderr. Exit codes: 0 when every
problem loads, 1 when any fails, 2 for bad usage (ROOT missing or holding no problem).

Not covered: running references or solutions (``kernelarc eval``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from kernelarc.cli.console import console
from kernelarc.problem.discover import ProblemSummary, find_problems, summarize


def _axes_cell(axes: dict[str, str]) -> str:
    parts = []
    for name, kind in axes.items():
        if kind == "var":
            parts.append(name)
        elif kind.startswith("const="):
            parts.append(f"{name}={kind.removeprefix('const=')}")
        else:
            parts.append(f"{name}={kind.removeprefix('expr: ')}")
    return ", ".join(parts)


def _print_table(summaries: list[ProblemSummary]) -> None:
    table = Table(title="Problems", show_lines=False)
    table.add_column("name", overflow="fold")
    table.add_column("subset")
    table.add_column("workloads", justify="right")
    table.add_column("axes (var bare)", overflow="fold")
    table.add_column("dtypes", overflow="fold")
    table.add_column("status")
    for s in summaries:
        status = Text("error", style="bold red") if s.error else Text("ok", style="green")
        table.add_row(
            Text(s.name),
            Text(s.subset or "-"),
            Text(str(s.workloads)),
            Text(_axes_cell(s.axes)),
            Text(", ".join(s.dtypes)),
            status,
        )
    out = console()
    out.print(table)
    failed = [s for s in summaries if s.error]
    for s in failed:
        out.print(Text(f"{s.name}: ", style="bold red") + Text(s.error or ""))
    total = sum(s.workloads for s in summaries)
    line = f"{len(summaries)} problems ({total} workloads), {len(failed)} failed"
    out.print(Text(line, style="bold red" if failed else "bold green"))


def problems_command(
    root: Annotated[
        Path,
        typer.Argument(
            help="A directory holding problem folders (each with definition.json), "
            "or one problem folder.",
            show_default=False,
            metavar="ROOT",
        ),
    ],
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print a JSON list (one object per problem) to stdout."),
    ] = False,
) -> None:
    """List the problems under ROOT with their workloads, axes and dtypes; check they load."""
    if not root.exists():
        raise typer.BadParameter(
            f"{root} does not exist; give a directory of problem folders "
            "(each holding definition.json and workload.jsonl)",
            param_hint="ROOT",
        )
    search = root.parent if root.is_file() and root.name == "definition.json" else root
    if not search.is_dir():
        raise typer.BadParameter(
            f"{root} is not a directory; give a directory of problem folders", param_hint="ROOT"
        )
    dirs = find_problems(search)
    if not dirs:
        raise typer.BadParameter(
            f"no problem found under {root}: no directory there holds a definition.json",
            param_hint="ROOT",
        )
    summaries = [summarize(d) for d in dirs]
    failed = sum(1 for s in summaries if s.error)
    if as_json:
        sys.stdout.write(json.dumps([s.model_dump(mode="json") for s in summaries], indent=2))
        sys.stdout.write("\n")
        sys.stdout.flush()
        sys.stderr.write(f"{len(summaries)} problems, {failed} failed\n")
    else:
        _print_table(summaries)
    if failed:
        raise typer.Exit(1)
