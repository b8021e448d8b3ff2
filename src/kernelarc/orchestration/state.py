"""The search's state: one object that the loop and its collaborators (``schedule.py``,
``finish.py``, ``confirm.py``, ``resume.py``) read and change, instead of attributes of the
orchestrator. Plain data with small methods for its own invariants; it logs nothing and
judges nothing (``events.py`` records, ``judge.py`` judges).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kernelarc.agents.board import Board
from kernelarc.agents.memory import ConclusionMemory
from kernelarc.agents.plateau import PlateauTracker
from kernelarc.agents.types import WorkloadResult


@dataclass
class RunState:
    """What the run knows and has spent so far, in this process (rebuilt on resume)."""

    agents: tuple[str, ...]
    """The run's agents, in their order (ties in the judging order go to the first)."""
    budget: int
    """Candidates the agents may have judged in all (``RunConfig.budget``)."""
    budget_per_agent: int | None
    patience: int
    board: Board = field(default_factory=Board)
    memory: ConclusionMemory = field(default_factory=ConclusionMemory)
    plateau: PlateauTracker = field(init=False)
    used: int = 0
    """Candidates judged (the budget spent)."""
    per_agent: dict[str, int] = field(init=False)
    errors: dict[str, int] = field(init=False)
    """Per agent: ``propose`` calls that raised."""
    retired: set[str] = field(default_factory=set)
    waiting: dict[str, int] = field(default_factory=dict)
    """Agents (``waits_for_board``) that had nothing to propose: the board version they
    saw; asked again once the board has changed."""
    asked: dict[str, int] = field(default_factory=dict)
    """Per agent: the board version when it was last asked to propose."""
    best_gathered: tuple[str, str] | None = None
    """The board's best when a pick last waited for proposals built on it
    (``schedule.Scheduler.gather_on_best``)."""
    results: dict[str, dict[str, tuple[WorkloadResult, ...]]] = field(default_factory=dict)
    """Per agent: the incumbent's per-workload results by stage."""
    feedback: dict[str, str] = field(default_factory=dict)
    """Per agent: what its next context says about its last candidate."""
    told_s: float = 0.0
    """Seconds spent telling (judging) ready proposals so far in this process; a ready
    proposal's wait is measured on this clock (``schedule.Scheduler.judging_order``)."""
    screen_cost: dict[str, float] = field(default_factory=dict)
    """Seconds the screening of each candidate judged in this process took."""
    agent_cost: dict[str, float] = field(default_factory=dict)
    """Per agent: the screening seconds of its latest candidate."""
    full_s: dict[str, float] = field(default_factory=dict)
    """Seconds of the full evaluation of each candidate that passed it (this process)."""
    full_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """Their full-protocol latencies: candidate → workload uuid → ms."""
    full_cost_warned: bool = False
    interrupted: bool = False
    """A stop signal cut the search or one of the end's judgements."""
    reference_broken: str | None = None
    """The reference's own error (first line) once it failed on every screened workload
    (``judge.reference_broken``): the search stops, nothing can be verified against it."""

    def __post_init__(self) -> None:
        if len(set(self.agents)) != len(self.agents):
            raise ValueError("agent names must be unique")
        self.plateau = PlateauTracker(self.patience)
        self.per_agent = {n: 0 for n in self.agents}
        self.errors = {n: 0 for n in self.agents}

    def budget_left(self) -> int:
        return self.budget - self.used

    def capped(self, name: str) -> bool:
        """Whether ``name`` has used its share of the budget (``budget_per_agent``)."""
        cap = self.budget_per_agent
        return bool(cap) and self.per_agent[name] >= (cap or 0)

    def count_judged(self, name: str) -> None:
        """One more candidate of ``name`` judged: the budget it costs."""
        self.used += 1
        self.per_agent[name] = self.per_agent.get(name, 0) + 1

    def incumbent_screens(self) -> list[tuple[WorkloadResult, ...]]:
        """Every incumbent's screening results (what a new screening is compared with)."""
        return [r["screen"] for r in self.results.values() if "screen" in r]

    def record_costs(
        self,
        candidate: str,
        name: str,
        screen_s: float,
        full: tuple[float, dict[str, float]] | None,
    ) -> None:
        """The judging times of ``candidate`` (of agent ``name``): its screening's seconds,
        and, when it passed the full stage, that stage's seconds and latencies."""
        self.screen_cost[candidate] = self.agent_cost[name] = screen_s
        if full is not None:
            self.full_s[candidate], self.full_ms[candidate] = full

    def judging_cost(self, parts: Iterable[str]) -> float:
        """The likeliest cost (seconds) of judging a composition of ``parts`` (candidate ids):
        the longest of their judgements, screening and full stage together. The composition
        is judged in a new worker, where a compiled part compiles again (its own stages
        shared one worker). 0 when none of them was judged in this process."""
        wanted = set(parts)
        return max(
            (t + self.screen_cost.get(c, 0.0) for c, t in self.full_s.items() if c in wanted),
            default=0.0,
        )
