"""The run's time limit: seconds left to the run, and to the search (less what is kept for
the run's end, ``schedule.reserve``). Without a limit, a practically endless 1e9 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

NO_LIMIT_S = 1e9


class Clock:
    """Started when made; ``reserve()`` is what the search leaves to the run's end."""

    def __init__(
        self, time_limit_s: float | None, reserve: Callable[[], float] = lambda: 0.0
    ) -> None:
        self.limit = time_limit_s
        self.reserve = reserve
        self.started = time.monotonic()

    @property
    def timed(self) -> bool:
        return self.limit is not None

    def left_total(self) -> float:
        """Seconds left to the run."""
        if self.limit is None:
            return NO_LIMIT_S
        return self.limit - (time.monotonic() - self.started)

    def left(self) -> float:
        """Seconds left to the search: the time limit less what has run, less the time kept
        for the run's end (``reserve``)."""
        return self.left_total() - self.reserve()
