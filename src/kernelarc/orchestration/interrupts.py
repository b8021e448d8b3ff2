"""Ctrl-C (and SIGTERM) that waits for the write in progress.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be. Inside a write
of the run's records that is harmful: pydantic's serializer turns it into a
``PydanticSerializationError`` (the run crashes instead of stopping cleanly), and a
candidate could be recorded without its ``candidate.json``. :class:`DeferredInterrupt`
installs a SIGINT handler that raises ``KeyboardInterrupt`` at once outside critical
sections (a long judgement stays interruptible) and, inside one, when the outermost section
ends normally. A section left by
an exception keeps the interrupt pending; :meth:`DeferredInterrupt.check` raises it at the
next safe point.

From the search's start to the run's end the orchestrator holds the signal
(:meth:`DeferredInterrupt.held`) and opens a :meth:`DeferredInterrupt.window` only around
what a signal may cut: the search, and each judgement at the run's end. A signal between
them waits for the next window, so the run always reaches its handover.

SIGTERM (``timeout``, a batch scheduler's notice, ``kill``) is taken as a Ctrl-C: the
search stops and the best judged so far is handed over, instead of the run dying with
nothing handed over. Only the first stop signal interrupts; later ones are counted and
ignored while the run stops (SIGKILL still ends it at once; ``--resume`` continues it). Not
covered: SIGKILL and other signals (the store's SQLite
transactions keep the run consistent for ``--resume``), and threads other than the main
one (signal handlers run there only; agent threads never write the run's records).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: The signals taken as a request to stop the search.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DeferredInterrupt:
    def __init__(self) -> None:
        self.depth = 0
        self.pending = False
        self.received: str | None = None
        """The name of the first stop signal received (``SIGINT``, ``SIGTERM``)."""
        self.count = 0
        """Stop signals received; only the first interrupts (the run is stopping already:
        ``timeout`` signals a whole process group, and a script may pass the signal on)."""
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take over SIGINT and SIGTERM (main thread only; elsewhere nothing changes). A
        signal that is ignored stays ignored: a job started in the background by a shell
        (``kernelarc optimize ... &`` in a script) ignores SIGINT, as a Ctrl-C at that
        terminal is not meant for it."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self._previous[sig] = signal.signal(sig, self._handler)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1:
            return
        self.received = signal.Signals(signum).name
        if self.depth:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def critical(self) -> Iterator[None]:
        """A section that a Ctrl-C does not cut: the interrupt is raised when it ends."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        self.check()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Like :meth:`critical`, except that a signal still pending when the outermost
        section ends is dropped, not raised (the run's end: it is stopping anyway). Use
        :meth:`window` for what a signal may cut inside it; inside, ``pending`` tells
        whether one came after the last window."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth:
                self.pending = False

    @contextmanager
    def window(self) -> Iterator[None]:
        """Inside :meth:`held`, a stretch that a stop signal cuts at once (one that came
        before it is raised on entry)."""
        saved, self.depth = self.depth, 0
        try:
            self.check()
            yield
        finally:
            self.depth = saved

    def check(self) -> None:
        """Raise a pending interrupt (outside every critical section)."""
        if self.pending and not self.depth:
            self.pending = False
            raise KeyboardInterrupt


__all__ = ["DeferredInterrupt"]
