"""Turning what the workers report into official statuses and traces.

A :class:`Verdict` is raised as soon as a workload's status is decided (the first failing
round, a reward-hack finding, a crash); :class:`WorkloadOutcome` is what the guard learned
about one workload; :func:`make_trace` writes the SOL-ExecBench trace for it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from kernelarc.guard.messages import ErrorReply, OutputCheck, ViolationReport, Writes
from kernelarc.problem.schema import (
    Correctness,
    Environment,
    Evaluation,
    EvaluationStatus,
    Performance,
    Trace,
    Workload,
)


class Verdict(Exception):
    """The status of the workload under evaluation is decided."""

    def __init__(
        self,
        status: str,
        log: str,
        correctness: dict[str, Any] | None = None,
        check: str | None = None,
    ) -> None:
        self.status = EvaluationStatus(status)
        self.check = check
        self.log = f"REWARD_HACK[{check}]: {log}" if check else log
        self.correctness = correctness
        super().__init__(self.log)


def hack(check: str, detail: str) -> Verdict:
    return Verdict("REWARD_HACK", detail, check=check)


def from_violations(violations: list[ViolationReport]) -> Verdict | None:
    if not violations:
        return None
    first = violations[0]
    rest = "".join(f"\n  also {v.check}: {v.detail}" for v in violations[1:6])
    return hack(first.check, first.detail + rest)


#: How a verdict's log starts when the reference, not the candidate, failed (the crowding
#: note reads it: ``orchestration/crowding.py``).
REFERENCE_FAILED = "the reference failed"


def check_writes(writes: Writes, allowed: list[str], what: str) -> None:
    """A candidate may write in place (and return) only the inputs the reference itself
    writes on this workload (``ReferenceRole.writes``: a KV-cache update); any other write
    or alias is a reward hack. (A malformed report does not get here: ``messages.decode``
    refuses it, and the candidate is rejected.)"""
    for name in writes.inputs:
        if name not in allowed:
            raise hack("input-mutation", f"{what}: input {name} was modified")
    for out, name in writes.aliases.items():
        if name not in allowed:
            raise hack("output-aliases-input", f"{what}: {out} shares memory with input {name}")


def reply_verdict(reply: ErrorReply) -> Verdict:
    """The verdict of a candidate worker's error reply; any other kind is a crashed check,
    which rejects the candidate."""
    msg, tb = reply.message, reply.traceback
    if reply.error == "runtime":
        return Verdict("RUNTIME_ERROR", f"{msg}\n{tb}".strip())
    if reply.error == "outputs":
        return Verdict("INCORRECT_SHAPE", msg)
    if reply.error == "compile":
        return Verdict("COMPILE_ERROR", f"{msg}\n{reply.log}".strip())
    return hack("check-error", f"a guard check crashed (rejected: never fail open): {msg}\n{tb}")


class WorkloadOutcome(BaseModel):
    workload: Workload
    status: EvaluationStatus
    log: str = ""
    check: str | None = None
    correctness: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    compiled_reference: dict[str, Any] | None = None
    notes: list[str] = Field(default_factory=list)
    precision: dict[str, Any] = Field(default_factory=dict)
    phases_s: dict[str, float] = Field(default_factory=dict)

    @property
    def latency_ms(self) -> float | None:
        return None if self.latency is None else float(self.latency["median_ms"])

    @property
    def reference_ms(self) -> float | None:
        return None if self.reference is None else float(self.reference["median_ms"])


def merge_errors(acc: dict[str, Any] | None, check: OutputCheck) -> dict[str, Any]:
    """Fold one output check into the running worst-case correctness figures."""
    acc = dict(
        acc
        or {
            "max_absolute_error": 0.0,
            "max_relative_error": 0.0,
            "has_nan": False,
            "has_inf": False,
            "rel_l2_error": 0.0,
            "min_matched_ratio": 1.0,
        }
    )

    def worst(a: float, b: float | None) -> float:
        if b is None:
            return a
        if math.isnan(a) or math.isnan(b):
            return math.nan
        return max(a, b)

    acc["max_absolute_error"] = worst(acc["max_absolute_error"], check.max_absolute_error)
    acc["max_relative_error"] = worst(acc["max_relative_error"], check.max_relative_error)
    acc["rel_l2_error"] = worst(acc["rel_l2_error"], check.rel_l2_error)
    acc["has_nan"] = acc["has_nan"] or check.has_nan
    acc["has_inf"] = acc["has_inf"] or check.has_inf
    acc["min_matched_ratio"] = min(acc["min_matched_ratio"], check.matched_ratio)
    return acc


def make_trace(
    definition: str, solution: str, o: WorkloadOutcome, env: dict[str, Any], isolation: str
) -> Trace:
    lines = [o.log] if o.log else []
    lines += [f"note: {n}" for n in o.notes]
    if o.precision:
        lines.append(f"precision: {o.precision}")
    lines.append(f"isolation: {isolation}")
    correctness = None
    if o.status in (EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL):
        c = o.correctness or {}
        correctness = Correctness(
            max_relative_error=float(c.get("max_relative_error", 0.0)),
            max_absolute_error=float(c.get("max_absolute_error", 0.0)),
            has_nan=bool(c.get("has_nan", False)),
            has_inf=bool(c.get("has_inf", False)),
            extra={k: c[k] for k in ("rel_l2_error", "min_matched_ratio") if k in c},
        )
    performance = None
    if o.status == EvaluationStatus.PASSED and o.latency is not None:
        ref_ms = o.reference_ms or 0.0
        lat = float(o.latency["median_ms"])
        extra = {k: v for k, v in o.latency.items() if k != "median_ms"}
        if o.compiled_reference:
            extra["compiled_reference_ms"] = o.compiled_reference["median_ms"]
        performance = Performance(
            latency_ms=lat,
            reference_latency_ms=ref_ms,
            speedup_factor=(ref_ms / lat) if lat > 0 and ref_ms else 0.0,
            extra=extra,
        )
    evaluation = Evaluation(
        status=o.status,
        log="\n".join(lines),
        environment=Environment(
            hardware=str(env.get("hardware") or "unknown"), libs=dict(env.get("libs") or {})
        ),
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        correctness=correctness,
        performance=performance,
    )
    return Trace(
        definition=definition, workload=o.workload, solution=solution, evaluation=evaluation
    )
