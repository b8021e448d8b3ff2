"""Ctrl-C that waits for the write in progress.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be. Inside a write
of the run's records that is harmful: pydantic's serializer turns it into a
``PydanticSerializationError`` (the run then crashed instead of stopping cleanly, found by
``tests/test_optimize_signals.py``), and a candidate could be recorded without its
``candidate.json``. :class:`DeferredInterrupt` installs a SIGINT handler that raises
``KeyboardInterrupt`` at once outside critical sections (a long judgement stays
interruptible) and, inside one, when the outermost section ends normally. A section left by
an exception keeps the interrupt pending; :meth:`DeferredInterrupt.check` raises it at the
next safe point.

Not covered: other signals (SIGTERM kills the process as before; the store's SQLite
transactions keep it consistent), and threads other than the main one (signal handlers run
there only; agent threads never write the run's records).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class DeferredInterrupt:
    def __init__(self) -> None:
        self.depth = 0
        self.pending = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Take over SIGINT (main thread only; elsewhere nothing changes). Where SIGINT is
        ignored (a job started in the background by a shell: ``kernelarc optimize ... &``
        in a script) it stays ignored, as a Ctrl-C at that terminal is not meant for it."""
        if threading.current_thread() is not threading.main_thread() or self._installed:
            return
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return
        self._previous = signal.signal(signal.SIGINT, self._handler)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
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

    def check(self) -> None:
        """Raise a pending interrupt (outside every critical section)."""
        if self.pending and not self.depth:
            self.pending = False
            raise KeyboardInterrupt


__all__ = ["DeferredInterrupt"]
