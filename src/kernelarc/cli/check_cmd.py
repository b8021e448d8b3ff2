"""``kernelarc check-problems ROOT``: does each problem's reference run on this machine?

Options: ``--device cpu|cuda|auto``, ``--workloads all|smallest|sample`` (sample = smallest,
median and largest by input bytes), ``--timeout S`` (per workload), ``--subset NAME``,
``--json``. The table has one row per problem (workloads ok/chosen, reference ms and bound
ms of the smallest chosen workload, notes such as generated inputs, status, reason), then
one summary row per subset with counts by reason. ``--json`` prints only a JSON list to
stdout (one object per problem: ``name``, ``subset``, ``path``, ``status`` "ok"/"failed",
``reason`` null when ok, ``category``, ``workloads`` with ``uuid``, ``axes``, ``status``,
``reason``, ``category``, ``input_bytes``, ``reference_ms``, ``bound_ms``, ``notes``);
progress and the summary go to stderr. Exit codes: 0 when every problem ran, 1 when some
failed (skipped for memory included), 2 for bad usage.

The work is done by :mod:`kernelarc.guard.survey`. Not covered: judging solutions.
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
from kernelarc.errors import KernelArcError
from kernelarc.guard.config import resolve_device
from kernelarc.guard.survey import (
    CATEGORY_LABELS,
    ProblemCheck,
    SurveyOptions,
    summary_by_subset,
    survey,
)
from kernelarc.problem.discover import find_problems
from kernelarc.problem.indices import GENERATED_NOTE


def _flags(res: ProblemCheck) -> str:
    notes = [n for w in res.workloads for n in w.notes]
    flags = []
    if any(n.startswith(GENERATED_NOTE) for n in notes):
        flags.append("generated inputs")
    if any("emulat" in n.lower() for n in notes):
        flags.append("emulated")
    return ", ".join(flags)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _print_table(results: list[ProblemCheck]) -> None:
    table = Table(title="Problem check", show_lines=False)
    for col in ("name", "subset", "workloads", "ref ms", "bound ms", "notes", "status"):
        table.add_column(col, overflow="fold", justify="right" if "ms" in col else "left")
    table.add_column("reason", overflow="fold")
    for r in results:
        ok = sum(1 for w in r.workloads if w.status == "ok")
        first = r.workloads[0] if r.workloads else None
        status = Text("ok", style="green") if r.status == "ok" else Text("failed", style="red")
        reason = "" if r.category is None else f"{CATEGORY_LABELS[r.category]}: {r.reason}"
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        table.add_row(
            Text(r.name),
            Text(r.subset or "-"),
            Text(f"{ok}/{len(r.workloads)}"),
            Text(_ms(first.reference_ms if first else None)),
            Text(_ms(first.bound_ms if first else None)),
            Text(_flags(r)),
            status,
            Text(reason),
        )
    out = console()
    out.print(table)
    summary = Table(title="Summary by subset")
    cats = [
        c for c in CATEGORY_LABELS if any(c in row for row in summary_by_subset(results).values())
    ]
    for col in ("subset", "problems", "ok", "failed", *[CATEGORY_LABELS[c] for c in cats]):
        summary.add_column(col, justify="left" if col == "subset" else "right")
    for subset, row in summary_by_subset(results).items():
        cells = [subset, row["problems"], row["ok"], row["failed"], *[row.get(c, 0) for c in cats]]
        summary.add_row(*[str(c) for c in cells])
    out.print(summary)


def _summary_line(results: list[ProblemCheck]) -> str:
    ok = sum(1 for r in results if r.status == "ok")
    parts = [f"{len(results)} problems, {ok} ok, {len(results) - ok} failed"]
    for subset, row in summary_by_subset(results).items():
        extra = {k: v for k, v in row.items() if k not in ("problems", "ok", "failed")}
        parts.append(f"{subset}: {row['ok']}/{row['problems']} ok {extra or ''}".rstrip())
    return "; ".join(parts)


def check_problems_command(
    root: Annotated[
        Path,
        typer.Argument(
            help="A directory of problem folders, or one problem folder.",
            show_default=False,
            metavar="ROOT",
        ),  # fmt: skip
    ],
    device: Annotated[str, typer.Option(help="cpu, cuda[:N] or auto.")] = "auto",
    workloads: Annotated[
        str, typer.Option(help="all, smallest, or sample (smallest, median, largest).")
    ] = "smallest",
    timeout: Annotated[
        float, typer.Option(help="Seconds per workload (run + one timed call).")
    ] = 300.0,
    subset: Annotated[
        str | None, typer.Option(help="Only this subset (L1, L2, Quant, ...).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list to stdout.")] = False,
) -> None:
    """Run each problem's reference on the chosen workloads; table of what runs and why not."""
    if workloads not in ("all", "smallest", "sample"):
        raise typer.BadParameter("use all, smallest or sample", param_hint="--workloads")
    if timeout <= 0:
        raise typer.BadParameter("must be > 0 seconds", param_hint="--timeout")
    if not root.exists():
        raise typer.BadParameter(f"{root} does not exist", param_hint="ROOT")
    search = root.parent if root.is_file() and root.name == "definition.json" else root
    dirs = find_problems(search) if search.is_dir() else []
    if not dirs:
        raise typer.BadParameter(f"no problem (definition.json) under {root}", param_hint="ROOT")
    try:
        dev = resolve_device(device)
    except KernelArcError as e:
        raise typer.BadParameter(str(e), param_hint="--device") from None
    opts = SurveyOptions(device=dev, workloads=workloads, timeout=timeout, subset=subset)  # type: ignore[arg-type]

    def progress(i: int, n: int, res: ProblemCheck) -> None:
        tail = "ok" if res.status == "ok" else f"failed ({res.category}): {res.reason}"
        sys.stderr.write(f"[{i}/{n}] {res.subset or '-'}/{res.name}: {tail} ({res.wall_s:.1f} s)\n")
        sys.stderr.flush()

    results = survey(dirs, opts, progress)
    if subset is not None and not results:
        raise typer.BadParameter(
            f"no problem of subset {subset!r} under {root}", param_hint="--subset"
        )
    if as_json:
        sys.stdout.write(json.dumps([r.model_dump(mode="json") for r in results], indent=2) + "\n")
        sys.stdout.flush()
        sys.stderr.write(_summary_line(results) + "\n")
    else:
        _print_table(results)
    if any(r.status != "ok" for r in results):
        raise typer.Exit(1)
