"""An in-process store: the second backend of the ``Store`` interface, and one for tests.

Everything is held as JSON text, exactly as the SQLite backend holds it, so both backends
give the same answers: a record reads back as ``model_validate_json(model_dump_json())`` of
what was written, dicts (run config, agent states, event payloads) read back as their JSON
round trip (tuples become lists, non-string keys become strings), and no object a caller
passes in or gets back shares state with the store.

Also here: the encoding helpers both backends use (``encode_model``, ``encode_object``,
``decode_object``, ``utc_now``). A record or dict that would not read back (a value JSON
cannot hold, a float pydantic writes as ``null`` into a required field) is refused with
``StoreError`` when it is written, never discovered when it is read.

Not covered: persistence (everything is lost with the process), several processes, read-only
mode. Use ``SQLiteStore`` for a real run.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from kernelarc.agents.types import Conclusion, IncumbentView
from kernelarc.store.base import (
    CandidateRecord,
    EvaluationRecord,
    EventRecord,
    Store,
    StoreError,
)


def utc_now() -> str:
    """The current time as an ISO 8601 string in UTC (``...+00:00``)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def encode_model(model: BaseModel, what: str) -> str:
    """``model`` as JSON, after checking that it validates back into its own type."""
    text = model.model_dump_json()
    try:
        type(model).model_validate_json(text)
    except ValidationError as e:
        raise StoreError(
            f"{what} would not read back from the store ({e.error_count()} error(s): "
            f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}); a NaN or infinite float in a "
            "required field is the usual cause: replace it with a finite value or None"
        ) from e
    return text


def encode_object(value: dict[str, Any], what: str) -> str:
    """A JSON object's text; ``StoreError`` when ``value`` is not a dict JSON can hold."""
    if not isinstance(value, dict):
        raise StoreError(f"{what} must be a dict, not {type(value).__name__}")
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as e:
        raise StoreError(
            f"{what} cannot be stored as JSON ({e}): keep it to dicts, lists, strings, "
            "numbers, booleans and None"
        ) from e


def decode_object(text: str, what: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise StoreError(f"{what} in the store is not a JSON object: the store is damaged")
    return value


class MemoryStore(Store):
    """A ``Store`` held in this process's memory; safe to call from several threads."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._closed = False
        self._config: str | None = None
        self._candidates: list[str] = []
        self._candidate_index: dict[str, int] = {}
        self._first_by_hash: dict[str, int] = {}
        self._evaluations: list[tuple[str, str]] = []
        self._conclusions: list[str] = []
        self._incumbents: dict[str, str] = {}
        self._agent_states: dict[str, str] = {}
        self._events: list[tuple[str, str]] = []

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the memory store is closed: create a new MemoryStore")

    # ------------------------------------------------------------------ run config

    def open_run(self, config: dict[str, Any]) -> dict[str, Any]:
        text = encode_object(config, "run config")
        with self._lock:
            self._check_open()
            if self._config is None:
                self._config = text
            return decode_object(self._config, "run config")

    # ------------------------------------------------------------------ candidates

    def add_candidate(self, record: CandidateRecord) -> CandidateRecord:
        with self._lock:
            self._check_open()
            if record.id in self._candidate_index:
                raise StoreError(
                    f"candidate id {record.id!r} is already in the store: ids must be unique"
                )
            stored = record.model_copy(update={"seq": len(self._candidates) + 1})
            text = encode_model(stored, f"candidate {record.id!r}")
            position = len(self._candidates)
            self._candidates.append(text)
            self._candidate_index[record.id] = position
            self._first_by_hash.setdefault(record.content_hash, position)
            return CandidateRecord.model_validate_json(text)

    def candidates(self) -> list[CandidateRecord]:
        with self._lock:
            self._check_open()
            return [CandidateRecord.model_validate_json(t) for t in self._candidates]

    def candidate(self, candidate_id: str) -> CandidateRecord | None:
        with self._lock:
            self._check_open()
            position = self._candidate_index.get(candidate_id)
            return None if position is None else self._candidate_at(position)

    def candidate_by_hash(self, content_hash: str) -> CandidateRecord | None:
        with self._lock:
            self._check_open()
            position = self._first_by_hash.get(content_hash)
            return None if position is None else self._candidate_at(position)

    def _candidate_at(self, position: int) -> CandidateRecord:
        return CandidateRecord.model_validate_json(self._candidates[position])

    # ------------------------------------------------------------------ evaluations

    def add_evaluation(self, record: EvaluationRecord) -> EvaluationRecord:
        with self._lock:
            self._check_open()
            if record.candidate_id not in self._candidate_index:
                raise StoreError(
                    f"evaluation of unknown candidate {record.candidate_id!r}: "
                    "add the candidate before its evaluations"
                )
            stored = record.model_copy(update={"seq": len(self._evaluations) + 1})
            text = encode_model(stored, f"evaluation of candidate {record.candidate_id!r}")
            self._evaluations.append((record.candidate_id, text))
            return EvaluationRecord.model_validate_json(text)

    def evaluations(self, candidate_id: str | None = None) -> list[EvaluationRecord]:
        with self._lock:
            self._check_open()
            return [
                EvaluationRecord.model_validate_json(text)
                for cid, text in self._evaluations
                if candidate_id is None or cid == candidate_id
            ]

    # ------------------------------------------------------------------ conclusions

    def add_conclusion(self, conclusion: Conclusion) -> Conclusion:
        with self._lock:
            self._check_open()
            stored = conclusion.model_copy(update={"seq": len(self._conclusions) + 1})
            text = encode_model(stored, f"conclusion on candidate {conclusion.candidate_id!r}")
            self._conclusions.append(text)
            return Conclusion.model_validate_json(text)

    def conclusions(self) -> list[Conclusion]:
        with self._lock:
            self._check_open()
            return [Conclusion.model_validate_json(t) for t in self._conclusions]

    # ------------------------------------------------------------------ incumbents, states

    def set_incumbent(self, view: IncumbentView) -> None:
        text = encode_model(view, f"incumbent of agent {view.agent!r}")
        with self._lock:
            self._check_open()
            self._incumbents[view.agent] = text

    def incumbents(self) -> dict[str, IncumbentView]:
        """Keyed by agent, in agent-name order."""
        with self._lock:
            self._check_open()
            return {
                agent: IncumbentView.model_validate_json(self._incumbents[agent])
                for agent in sorted(self._incumbents)
            }

    def save_agent_state(self, agent: str, state: dict[str, Any]) -> None:
        text = encode_object(state, f"state of agent {agent!r}")
        with self._lock:
            self._check_open()
            self._agent_states[agent] = text

    def agent_states(self) -> dict[str, dict[str, Any]]:
        """Keyed by agent, in agent-name order."""
        with self._lock:
            self._check_open()
            return {
                agent: decode_object(self._agent_states[agent], f"state of agent {agent!r}")
                for agent in sorted(self._agent_states)
            }

    # ------------------------------------------------------------------ events

    def log_event(self, kind: str, payload: dict[str, Any]) -> EventRecord:
        text = encode_object(payload, f"payload of event {kind!r}")
        with self._lock:
            self._check_open()
            event = EventRecord(
                seq=len(self._events) + 1,
                kind=kind,
                payload=decode_object(text, "event payload"),
                at=utc_now(),
            )
            stored = encode_model(event, f"event {kind!r}")
            self._events.append((kind, stored))
            return EventRecord.model_validate_json(stored)

    def events(self, kind: str | None = None) -> list[EventRecord]:
        with self._lock:
            self._check_open()
            return [
                EventRecord.model_validate_json(text)
                for k, text in self._events
                if kind is None or k == kind
            ]

    def close(self) -> None:
        with self._lock:
            self._closed = True
