"""Why a run has no solution: the failure its candidates share most.

When nothing passes, the candidates' own lines ("screen failed (RUNTIME_ERROR on workload
...)") do not say what went wrong, and the cause is often one the user must fix outside the
search, e.g. every candidate, the reference's own code among them, running out of GPU
memory on the same workload. :func:`common_failure` groups
the candidates by where each first failed (status and workload) and returns the largest
group, with the first line of one failure's log and whether the reference's code failed
there too (then no candidate can be verified on that workload on this machine).

Covered: each candidate's latest judgement of the agents' and finishers' candidates.
Not covered: telling why a log says what it says (the log is quoted, not interpreted).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kernelarc.store.base import Store


class CommonFailure(BaseModel):
    model_config = ConfigDict(frozen=True)
    status: str
    workload: str
    axes: dict[str, int]
    candidates: list[str]
    """The candidates that failed first here, in judging order."""
    of: int
    """Candidates that failed at all."""
    reference: str | None
    """The reference's own candidate among them, if any."""
    log: str
    """The first line of the first one's log (at most 300 characters)."""

    def sentence(self) -> str:
        axes = ", ".join(f"{k}={v}" for k, v in self.axes.items())
        where = f"workload `{self.workload}`" + (f" ({axes})" if axes else "")
        text = (
            f"Of the {self.of} candidates that failed, {len(self.candidates)} failed first on "
            f"{where} with {self.status}"
        )
        if self.reference:
            text += f", the reference's own code (`{self.reference}`) among them"
        text += f": `{self.log.replace('`', chr(39))}`." if self.log else "."
        if self.reference:
            text += (
                " The reference itself fails there in the guard on this machine, so no "
                "candidate can be verified on that workload here: leave it out with "
                f"`--workloads '!{self.workload}'`, or run where it fits (out of memory: "
                "a GPU with more memory)."
            )
        return text


def common_failure(store: Store, reference_hash: str) -> CommonFailure | None:
    """The largest group of candidates that failed first at the same status and workload
    (ties: the group met first); None when no candidate failed. ``reference_hash``: the
    content hash of the problem's reference as a solution, to tell its own candidates."""
    latest = {}
    for ev in store.evaluations():
        latest[ev.candidate_id] = ev
    itself = {c.id for c in store.candidates() if c.content_hash == reference_hash}
    groups: dict[tuple[str, str], list[tuple[str, str, dict[str, int]]]] = {}
    failed = 0
    for cid, ev in latest.items():
        if ev.result.passed:
            continue
        first = next((r for r in ev.result.per_workload if r.status != "PASSED"), None)
        if first is None:  # stopped early (hopeless, time limit) with no failed workload
            continue
        failed += 1
        line = first.log.strip().splitlines()[0] if first.log.strip() else ""
        groups.setdefault((first.status, first.uuid), []).append((cid, line, first.axes))
    if not groups:
        return None
    (status, uuid), members = max(groups.items(), key=lambda kv: len(kv[1]))
    return CommonFailure(
        status=status,
        workload=uuid,
        axes=members[0][2],
        candidates=[m[0] for m in members],
        of=failed,
        reference=next((m[0] for m in members if m[0] in itself), None),
        log=members[0][1][:300],
    )


__all__ = ["CommonFailure", "common_failure"]
