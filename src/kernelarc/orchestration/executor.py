"""Where proposals run. The orchestrator only submits callables and waits for futures, so
another executor (Ray actors for agents, one GPU evaluator actor per device, many nodes)
can replace the local one without changing agents or the store.

``LocalExecutor`` runs proposals in threads: a proposal is mostly waiting (a model call, a
compile), and agents are plain Python objects owned by this process. Its threads are daemon
threads, so a proposal still running when the run ends does not hold the process open (a
``ThreadPoolExecutor`` joins its threads at interpreter exit: a long tuning asked for near
the end would keep a finished run alive for minutes). Not covered: stopping such a
proposal's own work; it is cut off where it stands when the process exits, so a proposer
that starts a subprocess kills it itself at exit (``tunableop_worker.run_tuning``).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
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
    """At most ``workers`` proposals run at once, each in a daemon thread of its own; the
    others wait their turn (and are cancelled by :meth:`shutdown`)."""

    def __init__(self, workers: int) -> None:
        self._slots = threading.BoundedSemaphore(max(1, workers))
        self._futures: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("submit after shutdown: the executor is closed")
            fut: Future[Any] = Future()
            self._futures.add(fut)
        thread = threading.Thread(
            target=self._work, args=(fut, fn, args), name="kernelarc-agent", daemon=True
        )
        thread.start()
        return fut

    def _work(self, fut: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            with self._slots:
                if not fut.set_running_or_notify_cancel():
                    return  # cancelled while it waited for a slot
                try:
                    result = fn(*args)
                except BaseException as e:  # the future carries it to the orchestrator
                    fut.set_exception(e)
                else:
                    fut.set_result(result)
        finally:
            with self._lock:
                self._futures.discard(fut)

    def wait_any(self, futures: Iterable[Future[Any]], timeout: float | None) -> set[Future[Any]]:
        pending = list(futures)
        done, rest = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        if done and rest:  # proposals finishing together are judged by priority, not race
            more, _ = wait(rest, timeout=GRACE_S)
            done |= more
        return set(done)

    def shutdown(self) -> None:
        """Cancel the proposals not yet started; the running ones are not waited for."""
        with self._lock:
            self._closed = True
            pending = list(self._futures)
        for fut in pending:
            fut.cancel()
