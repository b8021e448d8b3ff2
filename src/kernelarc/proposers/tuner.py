"""The built-in tuner: local search over the launch tunables of Triton candidates.

Bases: every Triton incumbent it can see (``"triton"`` among ``solution.spec.languages``)
— the other agents' incumbents on the board and its own — that has at least one tunable
(:mod:`kernelarc.proposers.tunables`: block sizes, ROWS, num_warps, num_stages, split-K,
GROUP-style launch order, autotune pins). It tunes one base at a time: first the fastest
(score over eager); it switches when a Triton incumbent it had not seen appears on the
board and is better than the active base's best, or when a draft is requested (another
unfinished base, else the active base's neighbours in reverse order); a finished base
hands over to the best unfinished one.

Search (first-improvement coordinate descent): from the base's current best, every
one-step neighbour of one tunable (×2 / ÷2 within bounds for sizes, the next value of
{1, 2, 4, 8, 16} for num_warps, ±1 within 1..6 for num_stages, and each config of a
multi-config ``@triton.autotune`` list pinned alone); the move that improved last is tried
again first in the same direction. One candidate per proposal. A candidate that passed
the full protocol and is faster than the base's current best by more than
:data:`MIN_GAIN` (geomean over the workloads) becomes that base's best. Every proposed
source is remembered by content hash, bases included, so nothing is proposed twice. A
base is finished when no untried neighbour is left or after ``max_tries_per_base``
candidates.

With no Triton candidate with tunables anywhere (board and own incumbent) ``propose``
returns None; it sets ``waits_for_board`` so that an orchestrator honouring it asks again
when the board changes instead of retiring it.

Not covered: non-Triton candidates (nothing to tune), values computed from shapes (left
alone on purpose), moves of several tunables at once, widening autotune lists, per-shape
configurations (the composition at the end of a run gates per workload).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernelarc.agents.base import AgentStateError
from kernelarc.agents.types import (
    AgentContext,
    CandidateResult,
    Conclusion,
    IncumbentView,
    Outcome,
    Proposal,
)
from kernelarc.maths import geomean
from kernelarc.problem.schema import Language, Solution
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import (
    REGRESSED_BELOW,
    WorkloadClasses,
    clip,
    conclusion_of,
    effect_by_class,
    failure_summary,
)
from kernelarc.proposers.tunables import Kind, solution_tunables, tuned_solution

#: A move is kept when it is this much faster than the base's best (geomean).
MIN_GAIN = 0.02
#: At most this many configs of one autotune list are tried pinned alone.
MAX_PINS = 8

WARPS = (1, 2, 4, 8, 16)
STAGES = (1, 2, 3, 4, 5, 6)
#: (lowest, highest) value a ×2/÷2 move may reach, by kind (a base value outside widens).
BOUNDS: dict[str, tuple[int, int]] = {
    "block": (16, 8192),
    "rows": (1, 256),
    "group": (1, 64),
    "split": (1, 64),
}


def neighbours(kind: Kind, value: int) -> list[int]:
    """The values one step away from ``value`` (larger first): the next num_warps of
    :data:`WARPS`, num_stages ±1 within :data:`STAGES`, otherwise ×2 and ÷2 within
    :data:`BOUNDS`."""
    if kind in ("warps", "stages"):
        allowed = WARPS if kind == "warps" else STAGES
        up = [v for v in allowed if v > value]
        down = [v for v in allowed if v < value]
        return ([up[0]] if up else []) + ([down[-1]] if down else [])
    lo, hi = BOUNDS[kind]
    lo, hi = min(lo, value), max(hi, value)
    out = []
    if value * 2 <= hi:
        out.append(value * 2)
    if value % 2 == 0 and value // 2 >= lo:
        out.append(value // 2)
    return out


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Move(_Model):
    """One change: a tunable set to a new value, or an autotune list pinned to a config."""

    kind: Literal["set", "pin"]
    key: str
    old: int
    new: int
    label: str
    """For people, e.g. ``BLOCK_M 64->128``."""

    @property
    def direction(self) -> str:
        return "up" if self.new > self.old else "down"


class BaseState(_Model):
    """One base: where it came from and the best found from it so far."""

    candidate_id: str
    agent: str
    score: float
    best: Solution
    best_id: str
    best_ms: dict[str, float]
    best_score: float
    tries: int = 0
    done: bool = False
    last: tuple[str, str] | None = None
    """(key, direction) of the last kept ``set`` move."""
    kept: list[str] = Field(default_factory=list)


class Pending(_Model):
    base: str
    move: Move
    solution: Solution


class Classes(_Model):
    axis: str | None
    median: int | None


class TunerState(_Model):
    bases: list[BaseState] = Field(default_factory=list)
    active: str | None = None
    tried: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    pending: Pending | None = None
    count: int = Field(default=0, ge=0)
    classes: Classes | None = None


def is_triton(solution: Solution) -> bool:
    return Language.triton in solution.spec.languages


def moves_of(solution: Solution) -> list[Move]:
    """Every one-step move from ``solution``, in discovery order (see the module doc)."""
    found = solution_tunables(solution)
    multi = {s.key: s for s in found.autotune if len(s.configs) > 1}
    params = [p for p in found.params if p.autotune not in multi]
    names = [p.name for p in params]
    out: list[Move] = []
    for p in params:
        where = f" ({p.site})" if names.count(p.name) > 1 else ""
        for new in neighbours(p.kind, p.value):
            out.append(
                Move(
                    kind="set",
                    key=p.key,
                    old=p.value,
                    new=new,
                    label=f"{p.name} {p.value}->{new}{where}",
                )
            )
    for site in multi.values():
        n = len(site.configs)
        for i in range(min(n, MAX_PINS)):
            label = f"autotune of {site.kernel} pinned to config {i + 1}/{n} ({site.labels[i]})"
            out.append(Move(kind="pin", key=site.key, old=n, new=i, label=label))
    return out


def apply_move(solution: Solution, move: Move, *, name: str, author: str) -> Solution:
    values = {move.key: move.new} if move.kind == "set" else None
    pins = {move.key: move.new} if move.kind == "pin" else None
    return tuned_solution(
        solution,
        values,
        pins,
        name=name,
        author=author,
        description=f"{solution.name} with {move.label} (kernelarc tuner).",
    )


def _why(prev: BaseState | None, base: BaseState, draft: bool) -> str:
    """Why this base now, for the hypothesis."""
    if prev is None:
        return "the first Triton incumbent to tune"
    if base is prev:
        return "a draft: its neighbours in reverse order" if draft else "the next neighbour"
    if prev.done:
        return "the previous base is finished"
    return "a draft: another base" if draft else "a better Triton incumbent appeared"


class TunerAgent(BuiltinAgent):
    """Coordinate descent over the tunables of the best Triton candidates it can see."""

    name = "tuner"
    strategy = "tuner"
    who: ClassVar[str] = "tuner agent"
    saves_classes: ClassVar[bool] = False  # kept in its own state model (``TunerState``)
    priority: ClassVar[int] = 15
    description: ClassVar[str] = (
        "tunes block sizes, num_warps, num_stages, split-K/GROUP_M of Triton incumbents "
        "(its own and other agents'), one changed parameter per candidate"
    )
    waits_for_board: ClassVar[bool] = True
    """None from :meth:`propose` means "nothing to tune *yet*": ask again on a new board."""

    def __init__(self, max_tries_per_base: int = 32) -> None:
        if max_tries_per_base < 1:
            raise ValueError("max_tries_per_base must be at least 1")
        super().__init__()
        self.max_tries_per_base = max_tries_per_base
        self._s = TunerState()

    # ---------------------------------------------------------------- bases
    def _base(self, cid: str) -> BaseState:
        return next(b for b in self._s.bases if b.candidate_id == cid)

    def _scan(self, context: AgentContext) -> list[str]:
        """Add the Triton incumbents not seen before as bases; their candidate ids."""
        views: list[IncumbentView] = list(context.board.incumbents) if context.board else []
        if context.incumbent is not None:
            views.append(context.incumbent)
        known = {b.candidate_id for b in self._s.bases} | set(self._s.skipped)
        bests = {b.best.content_hash() for b in self._s.bases}
        new: list[str] = []
        for view in sorted(views, key=lambda v: -v.score):
            cid = view.candidate_id
            if cid in known:
                continue
            known.add(cid)
            digest = view.solution.content_hash()
            if not is_triton(view.solution) or digest in bests or not moves_of(view.solution):
                self._s.skipped.append(cid)
                continue
            self._s.bases.append(
                BaseState(
                    candidate_id=cid,
                    agent=view.agent,
                    score=view.score,
                    best=view.solution,
                    best_id=cid,
                    best_ms=dict(view.latencies_ms),
                    best_score=view.score,
                )
            )
            bests.add(digest)
            new.append(cid)
            if digest not in self._s.tried:
                self._s.tried.append(digest)
        return new

    def _choose(self, draft: bool, new: list[str]) -> BaseState | None:
        """The active base, unless a draft asks for another, a newly seen base is better,
        or it is finished (then the best unfinished one)."""
        open_ = [b for b in self._s.bases if not b.done]
        if not open_:
            return None
        active = next((b for b in open_ if b.candidate_id == self._s.active), None)
        if active is None:
            return max(open_, key=lambda b: b.best_score)
        if draft and len(open_) > 1:
            return max((b for b in open_ if b is not active), key=lambda b: b.best_score)
        fresh = [b for b in open_ if b.candidate_id in new]
        top = max(fresh, key=lambda b: b.best_score, default=None)
        if top is not None and top.best_score > active.best_score * (1 + MIN_GAIN):
            return top
        return active

    def _next_move(self, base: BaseState, draft: bool) -> tuple[Move, Solution] | None:
        if base.tries >= self.max_tries_per_base:
            return None
        moves = moves_of(base.best)
        if base.last is not None:
            key, direction = base.last
            moves.sort(key=lambda m: not (m.key == key and m.direction == direction))
        if draft:
            moves.reverse()
        tried = set(self._s.tried)
        for move in moves:
            sol = apply_move(
                base.best,
                move,
                name=f"{base.best.definition}-tuner-{self._s.count + 1}",
                author=f"kernelarc:{self.name}",
            )
            if sol.content_hash() not in tried:
                return move, sol
        return None

    # ---------------------------------------------------------------- ask
    def propose(self, context: AgentContext) -> Proposal | None:
        classes = WorkloadClasses.of(context.definition, context.workloads)
        self._s.classes = Classes(axis=classes.axis, median=classes.median)
        new = self._scan(context)
        draft = context.must_draft
        prev = next((b for b in self._s.bases if b.candidate_id == self._s.active), None)
        while (base := self._choose(draft, new)) is not None:
            found = self._next_move(base, draft and base.candidate_id == self._s.active)
            if found is None:
                base.done = True
                continue
            move, solution = found
            why = _why(prev, base, draft)
            self._s.active = base.candidate_id
            self._s.tried.append(solution.content_hash())
            self._s.pending = Pending(base=base.candidate_id, move=move, solution=solution)
            self._s.count += 1
            base.tries += 1
            origin = f"{base.agent}'s Triton candidate {base.candidate_id}"
            return Proposal(
                solution=solution,
                hypothesis=clip(
                    f"{move.label} on the best found from {origin} ({why}): launch "
                    "parameters change occupancy, tiling and pipelining; the guard checks "
                    "that the result stays within tolerance.",
                    1000,
                ),
                parent_id=base.best_id,
                mode="draft" if draft else "refine",
                tags=("tuner", move.kind, move.label.split(" ")[0]),
            )
        return None

    # ---------------------------------------------------------------- tell
    def observe(self, result: CandidateResult) -> Conclusion:
        pending, self._s.pending = self._s.pending, None
        c = self._s.classes
        classes = WorkloadClasses(axis=c.axis if c else None, median=c.median if c else None)
        if pending is None:
            claim = "tuner: a verdict arrived for no pending tuned candidate; nothing learned"
            none: Outcome = (
                "failed" if not result.passed else "improved" if result.improved else "no_gain"
            )
            return self._conclusion(result, claim, {}, none)
        base = self._base(pending.base)
        baseline = dict(base.best_ms)
        effect = effect_by_class(result.per_workload, classes, baseline)
        ratios = [
            baseline[r.uuid] / r.latency_ms
            for r in result.per_workload
            if r.status == "PASSED" and r.latency_ms and baseline.get(r.uuid)
        ]
        overall = geomean(ratios)
        kept = (
            result.passed
            and result.stage == "full"
            and overall is not None
            and overall > 1 + MIN_GAIN
        )
        move = pending.move
        head = f"{move.label} on {base.agent}'s {base.candidate_id}"
        if not result.passed:
            claim = f"{head}: {failure_summary(result)}"
        else:
            parts = [f"{v:.2f}x on {k}" for k, v in effect.items()]
            claim = f"{head}: {'; '.join(parts) or 'no workload measured'} vs the base's best"
            if result.stage == "screen":
                stop = f": {result.stopped_early}" if result.stopped_early else ""
                claim += f" (screening only{stop})"
            claim += "; kept" if kept else "; not kept"
        if result.cached:
            claim += " (cached verdict)"
        if kept:
            base.best = pending.solution
            base.best_id = result.candidate_id
            base.best_ms = {r.uuid: r.latency_ms for r in result.per_workload if r.latency_ms}
            base.best_score = result.score or base.best_score
            base.last = (move.key, move.direction) if move.kind == "set" else None
            base.kept.append(move.label)
        outcome: Outcome
        if not result.passed:
            outcome = "failed"
        elif kept or result.improved:
            outcome = "improved"
        elif overall is not None and overall < REGRESSED_BELOW:
            outcome = "regressed"
        else:
            outcome = "no_gain"
        return self._conclusion(result, claim, effect, outcome, move)

    def _conclusion(
        self,
        result: CandidateResult,
        claim: str,
        effect: dict[str, float],
        outcome: Outcome,
        move: Move | None = None,
    ) -> Conclusion:
        tags = ("tuner", move.kind, move.label.split(" ")[0]) if move else ("tuner",)
        return conclusion_of(
            self,
            result,
            claim=claim,
            effect=effect,
            tags=tags,
            outcome=outcome,
        )

    # ---------------------------------------------------------------- state
    def bases(self) -> list[BaseState]:
        """Copies of the bases (for reports and tests)."""
        return [b.model_copy(deep=True) for b in self._s.bases]

    def _state(self) -> dict[str, object]:
        return {"max_tries_per_base": self.max_tries_per_base, **self._s.model_dump(mode="json")}

    def _restore(self, state: dict[str, object]) -> None:
        data = dict(state)
        limit = data.pop("max_tries_per_base", self.max_tries_per_base)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise AgentStateError(f"tuner agent state: bad 'max_tries_per_base' {limit!r}")
        try:
            s = TunerState.model_validate(data)
        except ValidationError as e:
            raise AgentStateError(f"tuner agent state does not validate: {e}") from None
        ids = [b.candidate_id for b in s.bases]
        if len(set(ids)) != len(ids):
            raise AgentStateError("tuner agent state: a base appears twice")
        for ref in (s.active, s.pending.base if s.pending else None):
            if ref is not None and ref not in ids:
                raise AgentStateError(f"tuner agent state: {ref!r} is not among its bases")
        self.max_tries_per_base, self._s = limit, s


__all__ = [
    "MIN_GAIN",
    "neighbours",
    "BaseState",
    "Move",
    "TunerAgent",
    "apply_move",
    "is_triton",
    "moves_of",
]
