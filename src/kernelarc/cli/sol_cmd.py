"""``kernelarc sol PROBLEM_DIR``: the speed-of-light bound of each workload on a device.

One row per workload: index, uuid prefix, var axes, GFLOP, MB moved, the bounding term, and
T_sol. With ``--device b200`` and a ``metadata.json`` beside the problem, the published
``sol_ms`` and the ratio ours/theirs are shown too. Workloads whose flops cannot be counted
show ``-`` and their reason below the table. ``--json`` prints a JSON list instead.
Exit codes: 0 when every selected workload has a bound, 1 when some have none, 2 for bad
usage (unknown device, problem that does not load, bad workload selection).

Not covered: timing kernels (``kernelarc eval``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kernelarc.cli.console import console
from kernelarc.problem.expressions import AxisError
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Definition, Workload
from kernelarc.roofline.flops import count_workload
from kernelarc.roofline.profiles import DeviceProfile, get_profile
from kernelarc.roofline.score import t_sol_ms


def _select(problem: Problem, spec: list[str] | None) -> list[int]:
    """Indexes of the chosen workloads (all without ``spec``)."""
    if not spec:
        return list(range(len(problem.workloads)))
    return [problem.workloads.index(w) for w in problem.select(spec)]


def _published(metadata: dict[str, Any] | None, index: int) -> float | None:
    try:
        entry = (metadata or {})["sol"]["per_workload"][index]
        return float(entry["sol_ms"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1000:.2f} µs" if ms < 1 else f"{ms:.3f} ms"


def sol_command(
    problem_dir: Annotated[
        Path,
        typer.Argument(
            help="problem directory (definition.json + workload.jsonl) or a definition.json",
            show_default=False,
            metavar="PROBLEM_DIR",
        ),
    ],
    device: Annotated[
        str, typer.Option(help="profile: b200, h100, h200, cpu or local-cuda")
    ] = "h200",
    workloads: Annotated[
        list[str] | None,
        typer.Option(
            "--workloads",
            "-w",
            help="uuid, uuid prefix or index; repeatable or comma-separated; '!X' leaves X "
            "out (of all workloads when only left-out ones are given)",
        ),
    ] = None,
    convention: Annotated[
        str,
        typer.Option(
            help="solar (SOL-ExecBench's: fp32 matmuls at the bf16 tensor rate, fixed latency) "
            "or strict (pure roofline)"
        ),
    ] = "solar",
    count_on: Annotated[
        str,
        typer.Option(
            "--count-on",
            help="meta (default, with fallbacks), cpu or cuda: where the reference "
            "runs to be counted",
        ),
    ] = "meta",
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """Print T_sol (the roofline bound) of each workload of a problem."""
    err = console(stderr=True)
    if convention not in ("solar", "strict"):
        err.print(f"[red]--convention must be solar or strict, not {convention!r}[/]")
        raise typer.Exit(2)
    if count_on not in ("meta", "cpu", "cuda"):
        err.print(f"[red]--count-on must be meta, cpu or cuda, not {count_on!r}[/]")
        raise typer.Exit(2)
    try:
        profile = get_profile(device)
        problem = load_problem(problem_dir)
        chosen = _select(problem, workloads)
    except (OSError, ValueError) as e:  # KernelArcErrors are reported by cli/main.py
        err.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(2) from e
    definition, metadata = problem.definition, problem.metadata
    rows = _rows(
        definition, list(problem.workloads), chosen, profile, metadata, convention, count_on
    )
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
    else:
        _print(definition.name, profile.name, convention, rows, metadata is not None)
    if any(r["t_sol_ms"] is None for r in rows):
        raise typer.Exit(1)


def _rows(
    definition: Definition,
    wls: list[Workload],
    chosen: list[int],
    profile: DeviceProfile,
    metadata: dict[str, Any] | None,
    convention: str,
    count_on: str,
) -> list[dict[str, Any]]:
    compare = profile.name == "B200"
    rows: list[dict[str, Any]] = []
    for index in chosen:
        w = wls[index]
        row: dict[str, Any] = {
            "index": index,
            "uuid": w.uuid,
            "axes": dict(w.axes),
            "flops": None,
            "flops_by_class": None,
            "bytes": None,
            "bound": None,
            "t_sol_ms": None,
            "method": None,
            "reason": None,
            "notes": [],
        }
        try:
            cost = count_workload(definition, w, device=count_on)  # type: ignore[arg-type]
        except (AxisError, ValueError) as e:
            row["reason"] = f"{definition.name} workload {w.uuid}: {e}"
            rows.append(row)
            continue
        row.update(
            flops=cost.flops,
            flops_by_class=cost.flops_by_class,
            bytes=cost.bytes,
            method=cost.method,
            reason=cost.reason,
            notes=cost.notes,
        )
        if cost.flops_by_class is not None:
            ms, bound = t_sol_ms(cost, profile, convention=convention)  # type: ignore[arg-type]
            row.update(t_sol_ms=ms, bound=bound)
        if compare:
            theirs = _published(metadata, index)
            row["metadata_sol_ms"] = theirs
            row["ratio"] = (
                row["t_sol_ms"] / theirs if theirs and row["t_sol_ms"] is not None else None
            )
        rows.append(row)
    return rows


def _print(
    name: str, device: str, convention: str, rows: list[dict[str, Any]], has_metadata: bool
) -> None:
    compare = device == "B200" and has_metadata
    table = Table(title=f"{name}: T_sol on {device} ({convention} convention)")
    for col, justify in (
        ("#", "right"),
        ("uuid", "left"),
        ("axes", "left"),
        ("GFLOP", "right"),
        ("MB", "right"),
        ("bound", "left"),
        ("T_sol", "right"),
    ):
        table.add_column(col, justify=justify, no_wrap=col != "axes")  # type: ignore[arg-type]
    if compare:
        table.add_column("metadata sol", justify="right", no_wrap=True)
        table.add_column("ours/theirs", justify="right", no_wrap=True)
    for r in rows:
        axes = ", ".join(f"{k}={v}" for k, v in r["axes"].items())
        cells = [
            str(r["index"]),
            r["uuid"][:8],
            axes,
            "-" if r["flops"] is None else f"{r['flops'] / 1e9:.3f}",
            "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.2f}",
            r["bound"] or "-",
            _fmt_ms(r["t_sol_ms"]),
        ]
        if compare:
            cells += [
                _fmt_ms(r.get("metadata_sol_ms")),
                "-" if r.get("ratio") is None else f"{r['ratio']:.3f}",
            ]
        table.add_row(*(Text(c) for c in cells))
    out = console()
    out.print(table)
    for r in rows:
        if r["reason"]:
            out.print(Text(f"#{r['index']}: {r['reason']}", style="yellow"))
        approx = [n for n in r["notes"] if "placeholder" in n]
        if r["method"] not in (None, "meta") and approx:
            out.print(Text(f"#{r['index']} counted on {r['method']}: {approx[0]}", style="dim"))
