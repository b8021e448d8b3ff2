"""The board: every agent's incumbent, readable by all, writable only by its owner.

Covered: the orchestrator-side owner of the cross-agent state (:class:`Board`): replacing an
agent's incumbent (only that agent's own, enforced by :meth:`Board.update`), keeping the
last few incumbents each agent replaced (``former``), and handing out immutable, versioned
snapshots (:class:`~kernelarc.agents.types.BoardSnapshot`).

Why former incumbents: an agent's newer incumbent may be one others cannot build on
(a precision policy around a CUDA graph replaces the policy around the reference; a CUDA
graph cannot be compiled, so the compiler needs the former incumbent to combine with).

Not covered: deciding *whether* a candidate becomes an incumbent (the orchestrator does,
with ``orchestration/judge.py::significant``: a geomean gain above ``min_gain``),
persisting incumbents (the run store does; a resumed run replays them into a fresh board)
and plateau bookkeeping (``plateau.py``).

Isolation: the snapshot types are frozen pydantic models in tuples, but two of their
fields are mutable containers (``IncumbentView.latencies_ms`` is a dict, ``solution`` a
non-frozen :class:`~kernelarc.problem.schema.Solution`). The board therefore deep-copies
every view on the way in and on the way out: whatever a caller does to a view it passed in
or received, the board and every other snapshot stay as they were.
"""

from __future__ import annotations

from kernelarc.agents.types import BoardSnapshot, IncumbentView


class Board:
    """All incumbents of a run, one per agent, in the order agents first appeared."""

    FORMER_PER_AGENT = 3
    """Replaced incumbents kept per agent (the oldest beyond that are dropped)."""

    def __init__(self) -> None:
        self._incumbents: dict[str, IncumbentView] = {}
        self._former: list[IncumbentView] = []
        """Replaced incumbents, newest first."""
        self._version = 0

    @property
    def version(self) -> int:
        """Number of updates so far (the version of the next snapshot)."""
        return self._version

    def __len__(self) -> int:
        return len(self._incumbents)

    def agents(self) -> tuple[str, ...]:
        """Agents that have an incumbent, in the order they first got one."""
        return tuple(self._incumbents)

    def update(self, view: IncumbentView, *, owner: str) -> None:
        """Make ``view`` the incumbent of ``owner``, replacing its previous one.

        ``owner`` is the agent on whose behalf the orchestrator writes; it must be
        ``view.agent``: no agent can replace another's incumbent (PermissionError)."""
        if not isinstance(view, IncumbentView):
            raise TypeError(f"Board.update needs an IncumbentView, got {type(view).__name__}")
        if owner != view.agent:
            raise PermissionError(
                f"agent {owner!r} cannot replace the incumbent of agent {view.agent!r}: "
                "each agent writes only its own board entry"
            )
        old = self._incumbents.get(view.agent)
        if old is not None and old.candidate_id != view.candidate_id:
            self._former.insert(0, old)
            mine = [i for i, v in enumerate(self._former) if v.agent == view.agent]
            for i in reversed(mine[self.FORMER_PER_AGENT :]):
                del self._former[i]
        self._incumbents[view.agent] = view.model_copy(deep=True)
        self._version += 1

    def best(self) -> tuple[str, str] | None:
        """(agent, candidate id) of the best-scoring incumbent now, None on an empty board."""
        view = max(self._incumbents.values(), key=lambda v: v.score, default=None)
        return None if view is None else (view.agent, view.candidate_id)

    def incumbent(self, agent: str) -> IncumbentView | None:
        """A copy of ``agent``'s incumbent, or None when it has none yet."""
        view = self._incumbents.get(agent)
        return None if view is None else view.model_copy(deep=True)

    def snapshot(self) -> BoardSnapshot:
        """All incumbents now, as an independent copy; later updates do not show through."""
        return BoardSnapshot(
            incumbents=tuple(v.model_copy(deep=True) for v in self._incumbents.values()),
            version=self._version,
            former=tuple(v.model_copy(deep=True) for v in self._former),
        )
