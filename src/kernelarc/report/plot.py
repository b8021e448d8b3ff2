"""The trajectory as a picture: each judged candidate's score over the run's time.

One point per judged candidate (x: seconds since the run started, y: geomean speedup over
the eager reference on a log scale, colour: its agent; hollow: screened only; a cross at
the bottom: failed), the search's best full-protocol score as a step line, and a star at
the handed-over solution's own hand-over judgement (the reference at 1×: itself). Needs
matplotlib (``pip install 'kernelarc[report]'``); without it :func:`draw` raises
:class:`PlotUnavailable` naming the install, and the report says there is no picture.
"""

from __future__ import annotations

from pathlib import Path

from kernelarc.errors import KernelArcError
from kernelarc.report.trajectory import RunReport


class PlotUnavailable(KernelArcError):
    """matplotlib is not installed."""


def handed_over(report: RunReport) -> tuple[float, float, str] | None:
    """Where the handed-over solution is marked (seconds, speedup, label): at its hand-over
    judgement and the figure that judgement read; the reference at 1× (itself). None when
    nothing was handed over."""
    best = report.summary.get("best")
    step = next((s for s in reversed(report.steps) if s.candidate_id == report.best_id), None)
    if not best or step is None:
        return None
    if best.get("is_reference"):
        return step.at_s, 1.0, "handed over: the reference (no significant gain)"
    if not step.score:
        return None
    return step.at_s, step.score, f"handed over: {step.candidate_id} ({step.score:.2f}×)"


def draw(report: RunReport, path: Path) -> Path:
    """Write the trajectory picture (PNG) to ``path``; returns it."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        raise PlotUnavailable(
            f"no trajectory picture: matplotlib is not installed ({e}); "
            "pip install 'kernelarc[report]'"
        ) from None
    steps = report.steps
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    try:
        scores = [s.score for s in steps if s.score]
        floor = min([*scores, 1.0]) / 1.5
        agents = list(dict.fromkeys(s.agent for s in steps))
        colours = plt.get_cmap("tab10")
        for i, agent in enumerate(agents):
            colour = colours(i % 10)
            label: str | None = agent  # the agent's first drawn mark is labelled
            mine = [s for s in steps if s.agent == agent]
            for stage, face in (("full", colour), ("screen", "none")):
                pts = [(s.at_s, s.score) for s in mine if s.stage == stage and s.score is not None]
                if pts:
                    xs, ys = [x for x, _ in pts], [y for _, y in pts]
                    ax.scatter(xs, ys, facecolors=face, edgecolors=colour, label=label, zorder=3)
                    label = None
            failed = [s for s in mine if not s.score]
            if failed:
                xs = [s.at_s for s in failed]
                ax.scatter(xs, [floor] * len(xs), marker="x", color=colour, label=label, zorder=3)
        line = [(s.at_s, s.best_so_far) for s in steps if s.best_so_far]
        if line:
            ax.step([x for x, _ in line], [y for _, y in line], where="post", color="black",
                    linewidth=1, label="search's best (before the hand-over)")  # fmt: skip
        mark = handed_over(report)
        if mark is not None:
            ax.scatter([mark[0]], [mark[1]], marker="*", s=260, color="gold",
                       edgecolors="black", zorder=4, label=mark[2])  # fmt: skip
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_yscale("log")
        ticks = FuncFormatter(lambda v, _: f"{v:g}×")
        ax.yaxis.set_major_formatter(ticks)
        ax.yaxis.set_minor_formatter(ticks)
        ax.set_xlabel("seconds since the run started")
        ax.set_ylabel("speedup over eager (geomean)")
        ax.set_title(
            f"{report.summary.get('problem')}: candidates judged "
            "(filled: full protocol, hollow: screened only, x: failed)",
            fontsize="medium",
        )
        if steps:
            ax.legend(fontsize="small", loc="best")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
