"""The run store's interface: what a search run persists, and the one writer's methods.

A run directory holds one store (``store.sqlite`` for the default backend). The
orchestrator is its only writer; readers (``kernelarc status``, reports) open it read-only.
Everything needed to resume a killed run lives here: run config, candidates (sources,
content hash, parent, agent, strategy, mode), evaluations (per-workload traces and the
verdict summary), conclusions, incumbents, agent states and an event log.

Every backend must pass ``kernelarc.store.conformance.check_store``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelarc.agents.types import CandidateResult, Conclusion, IncumbentView, Mode
from kernelarc.errors import KernelArcError
from kernelarc.problem.schema import Solution, Trace

SCHEMA_VERSION = 1


class CandidateRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    content_hash: str
    agent: str
    strategy: str
    mode: Mode
    parent_id: str | None = None
    hypothesis: str = ""
    solution: Solution
    seq: int = 0
    """Insertion order, assigned by the store."""


class EvaluationRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    candidate_id: str
    stage: Literal["screen", "full"]
    traces: list[Trace] = Field(default_factory=list)
    result: CandidateResult
    seq: int = 0


class EventRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    seq: int
    kind: str
    payload: dict[str, Any]
    at: str


class StoreError(KernelArcError, RuntimeError):
    """The store cannot be used (wrong schema version, a different run's directory, ...)."""


class Store(ABC):
    @abstractmethod
    def open_run(self, config: dict[str, Any]) -> dict[str, Any]:
        """Record the run's config if the store is new; return the stored config (for a
        resumed run: the original one)."""

    @abstractmethod
    def add_candidate(self, record: CandidateRecord) -> CandidateRecord:
        """Insert a candidate (ids are unique); returns it with ``seq`` set."""

    @abstractmethod
    def candidates(self) -> list[CandidateRecord]:
        """All candidates in insertion order."""

    @abstractmethod
    def candidate(self, candidate_id: str) -> CandidateRecord | None: ...

    @abstractmethod
    def candidate_by_hash(self, content_hash: str) -> CandidateRecord | None:
        """The first candidate with this content hash (dedup)."""

    @abstractmethod
    def add_evaluation(self, record: EvaluationRecord) -> EvaluationRecord: ...

    @abstractmethod
    def evaluations(self, candidate_id: str | None = None) -> list[EvaluationRecord]:
        """Evaluations in insertion order (of one candidate, or all)."""

    @abstractmethod
    def add_conclusion(self, conclusion: Conclusion) -> Conclusion:
        """Insert; returns it with ``seq`` set."""

    @abstractmethod
    def conclusions(self) -> list[Conclusion]: ...

    @abstractmethod
    def set_incumbent(self, view: IncumbentView) -> None:
        """Replace ``view.agent``'s incumbent."""

    @abstractmethod
    def incumbents(self) -> dict[str, IncumbentView]: ...

    @abstractmethod
    def save_agent_state(self, agent: str, state: dict[str, Any]) -> None: ...

    @abstractmethod
    def agent_states(self) -> dict[str, dict[str, Any]]: ...

    @abstractmethod
    def log_event(self, kind: str, payload: dict[str, Any]) -> EventRecord: ...

    @abstractmethod
    def events(self, kind: str | None = None) -> list[EventRecord]: ...

    @abstractmethod
    def close(self) -> None: ...
