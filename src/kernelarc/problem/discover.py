"""Finding problem directories in a tree and summarising each one without failing.

Covered: :func:`find_problems` (every directory holding a ``definition.json``, the root
included) and :func:`summarize` (name, subset, workload count, axes, dtypes, loader notes, or
the load error). A problem that does not load yields a summary with ``error`` set, filled
with what the definition alone still tells (when it parses); :func:`summarize` never raises.

Not covered: checking that references run (``guard``), input generation (``inputs``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from kernelarc.errors import ProblemLoadError
from kernelarc.problem.loader import DEFINITION_FILE, SUBSETS, load_definition, load_problem
from kernelarc.problem.schema import ConstAxis, Definition, ExprAxis

_SKIPPED_DIRS = {"__pycache__", "node_modules"}


class ProblemSummary(BaseModel):
    """One line of ``kernelarc problems``: what a problem is, or why it does not load."""

    name: str
    subset: str | None = None
    path: str
    workloads: int = 0
    axes: dict[str, str] = Field(default_factory=dict)
    """Axis name -> ``"const=4096"``, ``"var"`` or ``"expr: a*b"``."""
    dtypes: list[str] = Field(default_factory=list)
    """Sorted distinct dtypes of the inputs and outputs."""
    notes: list[str] = Field(default_factory=list)
    error: str | None = None


def find_problems(root: Path | str) -> list[Path]:
    """Every directory at or below ``root`` holding a ``definition.json``, sorted. Hidden
    directories and caches are not searched. Symlinked directories are followed (a tree of
    links to problem folders is a problem tree); a directory already visited, e.g. through a
    link to one of its parents, is not searched again."""
    root = Path(root)
    found: list[Path] = []
    seen: set[str] = set()
    for current, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:  # a symlink loop, or a second link to the same folder
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS]
        if DEFINITION_FILE in files:
            found.append(Path(current))
    return sorted(found)


def describe_axes(definition: Definition) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, axis in definition.axes.items():
        if isinstance(axis, ConstAxis):
            out[name] = f"const={axis.value}"
        elif isinstance(axis, ExprAxis):
            out[name] = f"expr: {axis.expression}"
        else:
            out[name] = "var"
    return out


def _dtypes(definition: Definition) -> list[str]:
    specs = [*definition.inputs.values(), *definition.outputs.values()]
    return sorted({s.dtype.value for s in specs})


def summarize(path: Path | str) -> ProblemSummary:
    """Summary of one problem directory (or its ``definition.json``); never raises."""
    path = Path(path)
    problem_dir = path.parent if path.is_file() else path
    try:
        problem = load_problem(path)
    except ProblemLoadError as e:
        error = str(e)
    except Exception as e:  # a loader bug must not hide the other problems
        error = f"unexpected {type(e).__name__} while loading (a KernelArc bug): {e}"
    else:
        d = problem.definition
        return ProblemSummary(
            name=d.name,
            subset=problem.subset,
            path=str(path),
            workloads=len(problem.workloads),
            axes=describe_axes(d),
            dtypes=_dtypes(d),
            notes=list(problem.notes),
            error=None,
        )
    summary = ProblemSummary(
        name=problem_dir.name,
        subset=problem_dir.parent.name if problem_dir.parent.name in SUBSETS else None,
        path=str(path),
        error=error,
    )
    definition_file = problem_dir / DEFINITION_FILE
    if definition_file.is_file():
        try:
            d = load_definition(definition_file)
        except Exception:  # the load error above is already recorded; keep the dir name
            return summary
        summary.name, summary.axes, summary.dtypes = d.name, describe_axes(d), _dtypes(d)
    return summary
