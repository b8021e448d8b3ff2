"""The report a user reads after a run: ``report.md`` (the result, the trajectory, the lessons
learned) and ``trajectory.png`` beside it in the run directory (``report -o X.md``:
``X.png``).

``kernelarc optimize`` writes them when the run ends; ``kernelarc report RUN_DIR`` writes
them again for any run (also one still in progress, or killed). Read only on the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernelarc.errors import KernelArcError
from kernelarc.orchestration.rundir import write_atomic
from kernelarc.report.markdown import render
from kernelarc.report.plot import PlotUnavailable, draw
from kernelarc.report.trajectory import read_run
from kernelarc.store.sqlite import SQLiteStore

REPORT = "report.md"
PICTURE = "trajectory.png"


@dataclass(frozen=True)
class Written:
    report: Path
    picture: Path | None
    note: str | None
    """Why there is no picture (None when there is one)."""


def picture_beside(out: Path) -> Path:
    """The picture of a report written to ``out``: its name with ``.png`` for its suffix
    (``X.md`` -> ``X.png``), so reports written side by side keep their own pictures."""
    png = out.with_suffix(".png")
    return png if png != out else out.with_name(out.name + ".png")


def write_report(run_dir: Path, out: Path | None = None) -> Written:
    """Write the report of the run in ``run_dir`` to ``out`` (default ``RUN_DIR/report.md``)
    and its picture beside it (``RUN_DIR/trajectory.png`` by default, else
    :func:`picture_beside`). Raises ``KernelArcError`` when ``run_dir`` holds no run
    (``StoreError`` when its store does not read)."""
    path = run_dir / "store.sqlite"
    if not path.exists():
        raise KernelArcError(f"{run_dir} is not a run directory (no store.sqlite)")
    store = SQLiteStore(path, readonly=True)
    try:
        data = read_run(store, run_dir)
    finally:
        store.close()
    picture_path = run_dir / PICTURE if out is None else picture_beside(out)
    out = out or run_dir / REPORT
    picture: Path | None = None
    note = None
    try:
        picture = draw(data, picture_path)
    except PlotUnavailable as e:
        note = str(e)
    rel = None if picture is None else picture.name
    text = render(data, rel)
    if note:
        text += f"\n_{note}_\n"
    write_atomic(out, text)
    return Written(out, picture, note)
