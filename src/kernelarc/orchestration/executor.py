"""Where proposals run. The orchestrator only submits callables and waits for futures, so
another executor (Ray actors for agents, one GPU evaluator actor per device, many nodes)
can replace the local one without changing agents or the store.

``LocalExecutor`` runs proposals in threads: a proposal is mostly waiting (a model call, a
compile), and agents are plain Python objects owned by this process. Not covered: killing a
proposal that never returns (threads cannot be killed; the run's time limit stops waiting
for it and the process exit ends it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any


class Executor(ABC):
    @abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]: ...

    @abstractmethod
    def wait_any(self, futures: Iterable[Future[Any]], timeout: float | None) -> set[Future[Any]]:
        """The futures among ``futures`` that are done (at least one unless timed out)."""

    @abstractmethod
    def shutdown(self) -> None: ...


#: How long to wait, after the first proposal is ready, for others finishing together.
GRACE_S = 0.05


class LocalExecutor(Executor):
    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix="kernelarc-agent"
        )

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self._pool.submit(fn, *args)

    def wait_any(self, futures: Iterable[Future[Any]], timeout: float | None) -> set[Future[Any]]:
        pending = list(futures)
        done, rest = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        if done and rest:  # proposals finishing together are judged by priority, not race
            more, _ = wait(rest, timeout=GRACE_S)
            done |= more
        return set(done)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
