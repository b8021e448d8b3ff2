"""The typed messages of the search: what an agent is shown, what it proposes, what the
guard's verdict on a candidate looks like to it, and what it concludes.

Everything here is immutable (frozen pydantic models): an agent receives snapshots and
cannot change the run's state through them. Code (a solution's sources) appears only in
proposals and in incumbents on the board, never in conclusions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernelarc.problem.schema import Definition, Solution, Tolerance

Mode = Literal["refine", "draft"]
Outcome = Literal["improved", "no_gain", "regressed", "failed"]
CLAIM_MAX = 300


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Proposal(_Frozen):
    """A candidate an agent wants judged."""

    solution: Solution
    hypothesis: str = Field(max_length=1000)
    parent_id: str | None = None
    mode: Mode = "refine"
    tags: tuple[str, ...] = ()
    priority: int | None = None
    """Judging order among proposals ready together (higher first); None: the agent's class
    priority. For an agent whose likeliest win depends on the candidate (see the precision
    agent)."""
    reference_point: bool = False
    """Judged with the full protocol whenever its screening passes and the full stage fits
    half the time left, even when it is not promising: a figure users compare the result
    with (the compiler agent's torch.compile baseline; the report's ``report/baseline.py``).
    Not stored: a candidate in flight when a run died is judged again on resume by the
    ordinary rule."""


class WorkloadResult(_Frozen):
    """The guard's verdict on one workload, as agents see it."""

    uuid: str
    axes: dict[str, int]
    status: str
    check: str | None = None
    latency_ms: float | None = None
    reference_ms: float | None = None
    bound_ms: float | None = None
    log: str = ""

    @property
    def speedup(self) -> float | None:
        if self.latency_ms and self.reference_ms:
            return self.reference_ms / self.latency_ms
        return None


class CandidateResult(_Frozen):
    """What the guard found for one candidate (possibly only its screening stage)."""

    candidate_id: str
    agent: str
    strategy: str
    mode: Mode
    stage: Literal["screen", "full"]
    per_workload: tuple[WorkloadResult, ...]
    passed: bool
    """Every judged workload PASSED."""
    score: float | None
    """Geometric-mean speedup over the eager reference on the judged workloads (None
    unless passed)."""
    cached: bool = False
    """A duplicate of an already-judged candidate: the cached verdict, no budget spent."""
    improved: bool = False
    """Became the agent's new incumbent (a significant gain by the guard's rule)."""
    stopped_early: str | None = None
    """Why the evaluation stopped before the full protocol (hopeless, failed screening)."""


class Conclusion(_Frozen):
    """The lesson of one evaluated candidate: a claim and its measured effect; never code."""

    agent: str
    strategy: str
    candidate_id: str
    claim: str = Field(max_length=CLAIM_MAX)
    effect: dict[str, float] = Field(default_factory=dict)
    """Speedup over the agent's previous incumbent (or the reference), by workload class
    (e.g. ``"memory-bound, batch<=64"``)."""
    tags: tuple[str, ...] = ()
    outcome: Outcome
    seq: int = 0
    """Order of writing (set by the store)."""


class IncumbentView(_Frozen):
    """One agent's best candidate so far, readable by every agent."""

    agent: str
    strategy: str
    candidate_id: str
    score: float
    latencies_ms: dict[str, float]
    solution: Solution


class BoardSnapshot(_Frozen):
    """All incumbents at one moment. A snapshot: later changes do not show through."""

    incumbents: tuple[IncumbentView, ...] = ()
    version: int = 0
    former: tuple[IncumbentView, ...] = ()
    """Incumbents their own agent has since replaced, newest first (a few per agent): a
    policy around the reference stays a base for others after its agent moved on to a
    better candidate that others cannot build on (``Board.FORMER_PER_AGENT``)."""

    def best(self) -> IncumbentView | None:
        return max(self.incumbents, key=lambda i: i.score, default=None)

    def others(self, agent: str, *, former: bool = False) -> tuple[IncumbentView, ...]:
        """Other agents' incumbents, then (``former``) their former incumbents."""
        views = self.incumbents + (self.former if former else ())
        return tuple(i for i in views if i.agent != agent)


class AgentContext(_Frozen):
    """Everything an agent is shown when asked for a proposal."""

    problem: str
    definition: Definition
    device: str
    bounds_ms: dict[str, float] = Field(default_factory=dict)
    """Roofline bound per workload uuid on this device."""
    workloads: tuple[dict[str, int], ...] = ()
    """Axes of every workload, in file order."""
    scalars: tuple[dict[str, bool | int | float], ...] = ()
    """The scalar inputs' values of every workload (same order as ``workloads``; empty when
    the caller does not give them)."""
    tolerances: tuple[Tolerance, ...] = ()
    """Every workload's tolerance (same order as ``workloads``; empty when the caller does
    not give them)."""
    incumbent: IncumbentView | None = None
    incumbent_results: tuple[WorkloadResult, ...] = ()
    feedback: str = ""
    """The guard's log of the agent's last candidate when it failed."""
    board: BoardSnapshot | None = None
    conclusions: tuple[Conclusion, ...] = ()
    budget_left: int
    time_left_s: float | None = None
    """Seconds left to the run's search when the agent was asked (None: no time limit). A
    proposal that takes longer is judged by no one: a proposer whose work runs long (a
    tuning subprocess) bounds it by this."""
    must_draft: bool = False
    round: int = 0
    seed: int = 0

    @model_validator(mode="after")
    def _one_per_workload(self) -> AgentContext:
        if self.scalars and len(self.scalars) != len(self.workloads):
            raise ValueError(
                f"scalars: {len(self.scalars)} sets for {len(self.workloads)} workloads "
                "(give one per workload, or none)"
            )
        if self.tolerances and len(self.tolerances) != len(self.workloads):
            raise ValueError(
                f"tolerances: {len(self.tolerances)} for {len(self.workloads)} workloads "
                "(give one per workload, or none)"
            )
        return self
