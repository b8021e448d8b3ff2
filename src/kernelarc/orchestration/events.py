"""The run's recorder: every event goes to the store and to ``events.jsonl`` (and to the
caller's ``on_event``) through :class:`Events`, inside the stop signal's critical section
(``interrupts.py``), so that a Ctrl-C never cuts a record in half. Also where conclusions are
stored and put in the shared memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kernelarc.agents.memory import ConclusionMemory
from kernelarc.agents.types import Conclusion
from kernelarc.orchestration.interrupts import DeferredInterrupt
from kernelarc.orchestration.rundir import RunDir
from kernelarc.orchestration.state import RunState
from kernelarc.store.base import Store

T = TypeVar("T")
OnEvent = Callable[[str, dict[str, Any]], None]


class Events:
    """Logs the run's events and conclusions; owns the deferred stop signal."""

    def __init__(
        self,
        store: Store,
        run_dir: RunDir,
        state: RunState,
        *,
        memory: ConclusionMemory | None,
        on_event: OnEvent | None = None,
    ) -> None:
        self.store, self.dir, self.state = store, run_dir, state
        self.memory = memory
        """The shared memory conclusions go to; None when it is off (``RunConfig.memory``)."""
        self.on_event = on_event
        self.sigint = DeferredInterrupt()
        """Ctrl-C waits for the record being written (``interrupts.py``)."""

    def log(self, kind: str, payload: dict[str, Any]) -> None:
        """Log an event in the store and mirror it to ``events.jsonl``."""
        with self.sigint.critical():
            ev = self.store.log_event(kind, payload)
            self.dir.append_event(kind, payload, ev.at)
        if self.on_event is not None:
            self.on_event(kind, payload)

    def stopped_by_signal(self, during: str) -> None:
        """Record the stop signal (Ctrl-C, SIGTERM) that cut ``during``: the search, or one
        of the judgements at its end (``finish.py``), which is then abandoned."""
        self.state.interrupted = True
        self.log(
            "interrupted",
            {"used": self.state.used, "signal": self.sigint.received, "during": during},
        )

    def unless_stopped(self, during: str, judgement: Callable[[], T]) -> T | None:
        """``judgement()`` in a window a stop signal may cut (``DeferredInterrupt.window``):
        its result, or None when a signal cut it (recorded as cutting ``during``)."""
        try:
            with self.sigint.window():
                return judgement()
        except KeyboardInterrupt:
            self.stopped_by_signal(during)
            return None

    def conclude(self, conclusion: Conclusion) -> None:
        """Store a conclusion and put it in the shared memory."""
        self.remember(self.store.add_conclusion(conclusion))

    def remember(self, conclusion: Conclusion) -> None:
        """Into the shared memory, when it is on; a claim that looks like code is refused
        there (the store keeps every conclusion)."""
        if self.memory is None:
            return
        try:
            self.memory.add(conclusion)
        except ValueError as e:
            self.log("conclusion_rejected", {"agent": conclusion.agent, "why": str(e)})
