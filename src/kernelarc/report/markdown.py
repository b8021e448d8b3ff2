"""A run's report as Markdown: the result, the trajectory, the lessons learned.

Covered: the handed-over solution and its per-workload results (latency, eager reference,
speedup, fraction of the roofline bound where the run had one) or why there is none (none
passed: then the failure most candidates share, ``failures.py``, or the reference's own
error when it is broken; or the run has not finished: then the best judged so far), whether
a candidate was significantly faster than the reference (else the reference is the
solution), the workloads where the solution is slower than the reference, its speedup over
torch.compile's baseline where the run judged that in full, each judged candidate in
order, the conclusions grouped by agent, and the notable events. The text is built from a
:class:`~kernelarc.report.trajectory.RunReport` only, so it can be tested without a run.
Not covered: the picture (``plot.py``; the report links it when one was drawn).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kernelarc.maths import geomean
from kernelarc.orchestration.finish import NO_GAIN
from kernelarc.orchestration.judge import TIME_LIMIT
from kernelarc.report.trajectory import RunReport


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}×"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def _quoted(text: str) -> str:
    """``text`` fit for inline code: backticks replaced."""
    return text.replace("`", "'")


def _cell(text: object, limit: int = 120) -> str:
    """One table cell: no pipes or newlines, at most ``limit`` characters."""
    s = " ".join(str(text).replace("|", "/").split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _no_result(report: RunReport) -> list[str]:
    """Why there is no handed-over solution: none passed, or the run never got to choose."""
    ended = [e for e in report.notable if e["kind"] == "no_solution"]
    broken = report.summary.get("reference_broken")
    if broken:
        return [
            "**The reference is broken: it fails on every screened workload** "
            f"(`{_quoted(broken)}`). The run stopped before judging other candidates: no "
            "solution was handed over. "
            "Fix the problem's reference (`kernelarc eval PROBLEM_DIR` runs it) and run again."
        ]
    if ended:
        lines = ["**No solution passed the full protocol.** See the trajectory and events below."]
        if ended[-1].get("common_failure"):  # the failure most candidates shared
            lines += ["", str(ended[-1]["common_failure"])]
        return lines
    stopped = report.summary.get("stopped")
    when = (
        "during its search"
        if stopped is None
        else f"after its search stopped ({stopped}), while it chose its solution"
    )
    lines = [
        f"**The run has not finished: it is still running, or it was stopped {when} (killed, "
        "or crashed), so no solution was handed over.** `kernelarc optimize "
        f"{report.config.get('problem') or 'PROBLEM'} --run-dir {report.run_dir} --resume` "
        "finishes it."
    ]
    full = [s for s in report.steps if s.stage == "full" and s.passed and s.score]
    if full:
        top = max(full, key=lambda s: s.score or 0.0)
        lines.append(
            f"{len(full)} judgement(s) passed the full protocol so far; the best, `"
            f"{top.candidate_id}` ({top.agent}), reads {_x(top.score)} the eager reference "
            "(not confirmed: a finished run confirms its choice in a new process)."
        )
    return lines


def _result(report: RunReport) -> list[str]:
    best = report.summary.get("best")
    if not best:
        return _no_result(report)
    lines = [f"Solution: `{best['path']}` (candidate `{report.best_id}`"]
    if report.best_origin:
        lines[0] += f", the confirmation of `{report.best_origin}` in a new process"
    lines[0] += ")."
    if best.get("is_reference"):
        lines.append(
            f"**{NO_GAIN[0].upper()}{NO_GAIN[1:]}**: the solution is the reference's own code "
            "(its reading away from 1× below is the measurement's noise)."
        )
    else:
        lines.append(
            f"Handed over: `{report.best_id}` of agent `{best.get('agent')}`, "
            f"{_x(best.get('speedup'))} over the eager reference as its hand-over judgement "
            "read it" + (" (the confirmation)." if report.best_origin else ".")
        )
    slower = best.get("slower_workloads") or []
    if slower:
        named = ", ".join(
            f"{', '.join(f'{k}={v}' for k, v in s['axes'].items()) or s['uuid']} "
            f"({_x(s['speedup'])})"
            for s in slower
        )
        lines.append(f"Slower than the reference on {len(slower)} workload(s): {named}.")
    wls = report.best_workloads
    ok = [w for w in wls if w.status == "PASSED" and w.latency_ms]
    speed = geomean([w.speedup for w in ok if w.speedup])
    bound = geomean([w.bound_ms / w.latency_ms for w in ok if w.bound_ms and w.latency_ms])
    lines.append(
        f"{len(ok)}/{len(wls)} workloads passed; geomean speedup over the eager reference "
        f"{_x(speed)}" + (f"; {100 * bound:.1f}% of the roofline bound" if bound else "") + "."
    )
    lines += _versus_compile(report, len(wls))
    if report.summary.get("workloads"):
        lines.append(
            f"The run judged {len(report.summary['workloads'])} chosen workload(s) only "
            "(`--workloads`): the others are not verified (`kernelarc eval`)."
        )
    rows = [
        (
            ", ".join(f"{k}={v}" for k, v in w.axes.items()),
            w.status,
            _ms(w.latency_ms),
            _ms(w.reference_ms),
            _x(w.speedup),
            "-" if not (w.bound_ms and w.latency_ms) else f"{100 * w.bound_ms / w.latency_ms:.1f}%",
        )
        for w in wls
    ]
    head = ("workload", "status", "ms", "eager ms", "speedup", "of bound")
    return [*lines, "", *_table(head, rows)]


def _versus_compile(report: RunReport, n: int) -> list[str]:
    cb = report.compile_baseline
    if cb is None:
        return []
    what = f"torch.compile's baseline (`torch.compile(run, dynamic=False)`, `{cb.candidate}`)"
    ratios = cb.ratios()
    if not ratios:
        if cb.stopped:
            why = f" (stopped: {cb.stopped})"
        elif cb.stage == "screen" and cb.screen_score is not None:
            why = f" ({_x(cb.screen_score)} the eager reference there: not promising enough)"
        else:
            why = ""
        return [
            f"{what} was judged no further than its {cb.stage} stage in this run{why}: no "
            "comparison over the workloads (`kernelarc eval PROBLEM -s SOLUTION "
            "--compile-baseline` times it)."
        ]
    whose = f"`{cb.chosen}`" + (" as the search judged it" if report.best_origin else "")
    return [
        f"Against {what}, judged in full in this run: speedup {_x(geomean(ratios))} for "
        f"{whose} (geomean over the {len(ratios)}/{n} workloads both passed)."
    ]


def _not_passed(stopped: str | None) -> str:
    """The score cell of a candidate that did not pass: cut by the run's time limit (which
    says nothing of the candidate), or failed, and why where the run recorded it."""
    if stopped == TIME_LIMIT:
        return f"cut ({TIME_LIMIT})"
    return f"failed ({stopped or 'see traces'})"


def _trajectory(report: RunReport, picture: str | None) -> list[str]:
    if not report.steps:
        return ["No candidate was judged."]
    lines = [f"![trajectory]({picture})", ""] if picture else []
    rows = [
        (
            s.order,
            f"{s.at_s:.0f}",
            s.candidate_id,
            s.agent,
            s.parent_id or "-",
            s.stage,
            _x(s.score) if s.passed else _not_passed(s.stopped),
            "yes" if s.improved else "",
            _x(s.best_so_far),
            s.hypothesis,
        )
        for s in report.steps
    ]
    head = ("#", "s", "candidate", "agent", "parent", "stage", "score", "kept", "best", "idea")
    return [*lines, *_table(head, rows)]


def _lessons(report: RunReport) -> list[str]:
    if not report.conclusions:
        return ["No conclusions were recorded."]
    lines: list[str] = []
    for agent in dict.fromkeys(c.agent for c in report.conclusions):
        lines += ["", f"**{agent}**", ""]
        for c in (c for c in report.conclusions if c.agent == agent):
            effect = ", ".join(f"{k}: {v:.3g}×" for k, v in c.effect.items())
            lines.append(
                f"- {c.outcome}: {_cell(c.claim, 300)}" + (f" ({effect})" if effect else "")
            )
    return lines[1:]


def _event_line(e: dict[str, Any]) -> str:
    rest = {k: v for k, v in e.items() if k != "kind"}
    text = e.get("why") or ", ".join(f"{k}={v}" for k, v in rest.items())
    return f"- `{e['kind']}`: {_cell(text, 300)}"


def render(report: RunReport, picture: str | None = None) -> str:
    """The report's Markdown; ``picture``: the trajectory image's path relative to it."""
    s, cfg = report.summary, report.config
    head = [
        f"# KernelArc run: {s.get('problem')}",
        "",
        f"Problem `{cfg.get('problem')}`, device `{cfg.get('device')}`, agents "
        f"{', '.join(cfg.get('agents', []))}; budget {s.get('budget')}, "
        f"{s.get('evaluated')} candidates judged, {s.get('passed')} passed the full "
        f"protocol; stopped: {s.get('stopped')}. Run directory `{report.run_dir}`.",
        "",
        "## Result",
        "",
    ]
    body = [*head, *_result(report), "", "## Trajectory", "", *_trajectory(report, picture)]
    body += ["", "## Lessons learned", "", *_lessons(report)]
    if report.notable:
        body += ["", "## Events", "", *(_event_line(e) for e in report.notable)]
    return "\n".join(body) + "\n"
