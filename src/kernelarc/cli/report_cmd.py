"""``kernelarc report``: a run's report (result, trajectory, lessons) as Markdown + picture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kernelarc.cli.console import console
from kernelarc.report import write_report


def report_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory of `kernelarc optimize`")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="the Markdown file (default: RUN_DIR/report.md); its picture goes "
            "beside it, X.md -> X.png (default: RUN_DIR/trajectory.png)",
        ),
    ] = None,
) -> None:
    """Write a run's report: the solution and its per-workload results, every judged
    candidate in order, the lessons learned, and the trajectory as a picture beside it."""
    written = write_report(run_dir, output)
    err = console(stderr=True)
    if written.note:
        err.print(f"[yellow]{escape(written.note)}[/]")
    typer.echo(str(written.report))
