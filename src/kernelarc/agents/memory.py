"""Conclusions-only shared memory: the lessons every agent can read, bounded and ranked.

Covered: holding :class:`~kernelarc.agents.types.Conclusion` objects (never code: claims that
look like source are refused), bounding the store by ``capacity`` with a fixed eviction
rule, ranking the few most useful lessons for one agent (:meth:`ConclusionMemory.top_k`),
and carrying lessons across runs as a JSON-lines file (:meth:`~ConclusionMemory.save`,
:meth:`~ConclusionMemory.load`, :meth:`~ConclusionMemory.merge`).

Not covered: writing conclusions (agents do, in ``Agent.observe``), persisting the run's own
conclusions (the run store does; this memory is rebuilt from it on resume), and any
semantic understanding of claims: the code filter is a marker check, not a parser.

Sequence numbers: inside this memory ``seq`` is the memory's own write order (1, 2, ...),
assigned by :meth:`~ConclusionMemory.add` whatever ``seq`` the conclusion arrived with. A
conclusion loaded from a file or merged from another memory keeps all its other fields but
is given a fresh ``seq`` after every conclusion already held, in its original order; so
recency ranks cross-run lessons by when this memory learnt them. The store's ``seq`` for the
same conclusion may therefore differ; identify a conclusion by ``candidate_id``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from kernelarc.agents.types import Conclusion, Outcome
from kernelarc.errors import KernelArcError

MEMORY_FORMAT = 1
"""Version written in the header line of a memory file: ``{"kernelarc_memory": 1}``."""

OUTCOME_WEIGHT: dict[Outcome, float] = {
    "improved": 1.0,
    "regressed": 0.6,
    "failed": 0.4,
    "no_gain": 0.2,
}
SAME_STRATEGY_BONUS = 1.0
OTHER_AGENT_BONUS = 0.5
_LOW_VALUE: frozenset[Outcome] = frozenset({"no_gain", "failed"})

CODE_MARKERS: tuple[str, ...] = (
    "```",
    "@triton.jit",
    "@triton.autotune",
    "__global__",
    "__device__",
    "#include",
)
"""Substrings that only appear in source code; a claim containing one is refused."""
_CODE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("def ", re.compile(r"\bdef\s")),
    ("import ", re.compile(r"\bimport\s")),
)
MAX_CLAIM_LINES = 2


class MemoryFileError(KernelArcError):
    """A memory file cannot be read. Names the file and, where known, the line."""

    def __init__(self, file: str | os.PathLike[str], message: str, *, line: int | None = None):
        self.file, self.line, self.message = str(file), line, message
        where = self.file + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: {message}")


def code_marker(claim: str) -> str | None:
    """The first sign that ``claim`` carries source code rather than a lesson, else None."""
    for marker in CODE_MARKERS:
        if marker in claim:
            return repr(marker)
    for name, pattern in _CODE_PATTERNS:
        if pattern.search(claim):
            return repr(name)
    lines = len(claim.splitlines())
    if lines > MAX_CLAIM_LINES:
        return f"{lines} lines (at most {MAX_CLAIM_LINES})"
    return None


def check_claim(c: Conclusion) -> None:
    """Raise ValueError when the conclusion's claim looks like code."""
    found = code_marker(c.claim)
    if found is not None:
        raise ValueError(
            f"conclusion of agent {c.agent!r} on candidate {c.candidate_id!r} looks like code "
            f"(found {found}); conclusions carry lessons, never code: state what was tried "
            "and what the guard measured in one or two plain sentences"
        )


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    """|a ∩ b| / |a ∪ b| of two tag sets; 0.0 when both are empty."""
    sa, sb = set(a), set(b)
    union = sa | sb
    return len(sa & sb) / len(union) if union else 0.0


def _identity(c: Conclusion) -> tuple[str, str, str, str, str]:
    """What makes two conclusions the same lesson (everything that matters except seq)."""
    return (c.agent, c.strategy, c.candidate_id, c.outcome, c.claim)


class ConclusionMemory:
    """A bounded, ranked store of conclusions shared by all agents of a run.

    Ranking (:meth:`top_k`, :meth:`score`), for a query ``(agent, strategy, tags)``::

        relevance = jaccard(c.tags, tags)                  # 0..1 tag overlap
                  + 1.0 if c.strategy == strategy          # same family
                  + 0.5 if c.agent != agent                # a lesson from another agent
                  + outcome weight                         # improved 1.0, regressed 0.6,
                                                           # failed 0.4, no_gain 0.2
        recency   = exp(-(newest_seq - c.seq) / half_life) # 1.0 for the newest entry
        score     = relevance + recency

    Higher scores first; equal scores: higher ``seq`` (newer) first. ``half_life`` is the
    decay constant of that exponential (after ``half_life`` writes a lesson keeps 1/e of
    its recency bonus).

    Eviction: adding to a full memory removes exactly one held entry: the oldest whose
    outcome is ``no_gain`` or ``failed``; when there is none, the oldest entry overall. The
    new conclusion is always kept (it is the freshest observation).

    Every conclusion handed out is a copy: changing it does not change the memory.
    """

    def __init__(self, capacity: int = 200, *, half_life: float = 50.0) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"memory capacity must be a positive integer, got {capacity!r}")
        if not math.isfinite(half_life) or half_life <= 0:
            raise ValueError(f"memory half_life must be a positive number, got {half_life!r}")
        self.capacity = capacity
        self.half_life = float(half_life)
        self._entries: list[Conclusion] = []  # in seq order
        self._next_seq = 1

    # ------------------------------------------------------------------ writing

    def add(self, c: Conclusion) -> None:
        """Store a copy of ``c`` with the next ``seq``; evict one entry if full.
        ValueError when the claim looks like code."""
        check_claim(c)
        self._append(c)

    def _append(self, c: Conclusion) -> None:
        if len(self._entries) >= self.capacity:
            self._evict_one()
        self._entries.append(c.model_copy(update={"seq": self._next_seq}, deep=True))
        self._next_seq += 1

    def _evict_one(self) -> None:
        for i, entry in enumerate(self._entries):
            if entry.outcome in _LOW_VALUE:
                del self._entries[i]
                return
        del self._entries[0]

    def _add_new(self, conclusions: Iterable[Conclusion]) -> int:
        """Append those not already held (same agent, strategy, candidate, outcome and
        claim), in the given order; returns how many were added."""
        known = {_identity(e) for e in self._entries}
        added = 0
        for c in conclusions:
            key = _identity(c)
            if key in known:
                continue
            check_claim(c)
            self._append(c)
            known.add(key)
            added += 1
        return added

    def merge(self, other: ConclusionMemory) -> int:
        """Add ``other``'s conclusions (in its order) after ours, skipping lessons already
        held; returns how many were added."""
        return self._add_new(list(other._entries))

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._entries)

    def all(self) -> tuple[Conclusion, ...]:
        """Every held conclusion, oldest first (copies)."""
        return tuple(e.model_copy(deep=True) for e in self._entries)

    def score(self, c: Conclusion, *, agent: str, strategy: str, tags: Sequence[str]) -> float:
        """The ranking score of ``c`` for this query (formula in the class docstring);
        recency is measured against the newest conclusion held."""
        newest = self._entries[-1].seq if self._entries else c.seq
        relevance = jaccard(c.tags, tags) + OUTCOME_WEIGHT[c.outcome]
        if c.strategy == strategy:
            relevance += SAME_STRATEGY_BONUS
        if c.agent != agent:
            relevance += OTHER_AGENT_BONUS
        recency = math.exp(-max(newest - c.seq, 0) / self.half_life)
        return relevance + recency

    def top_k(
        self, agent: str, strategy: str, tags: Sequence[str], k: int = 5
    ) -> tuple[Conclusion, ...]:
        """The ``k`` best-ranked conclusions for ``agent`` (of ``strategy``) working on a
        candidate described by ``tags``; fewer when fewer are held."""
        if k < 0:
            raise ValueError(f"top_k needs k >= 0, got {k}")
        query = tuple(tags)
        ranked = sorted(
            self._entries,
            key=lambda e: (self.score(e, agent=agent, strategy=strategy, tags=query), e.seq),
            reverse=True,
        )
        return tuple(e.model_copy(deep=True) for e in ranked[:k])

    # ------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the memory as JSON lines: a header ``{"kernelarc_memory": 1}``, then one
        conclusion per line, oldest first. The file is replaced atomically."""
        target = Path(path)
        lines = [json.dumps({"kernelarc_memory": MEMORY_FORMAT})]
        lines += [e.model_dump_json() for e in self._entries]
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, target)

    def load(self, path: str | os.PathLike[str]) -> int:
        """Add the conclusions of a file written by :meth:`save` after those held (fresh
        ``seq`` values, file order kept; lessons already held are skipped). The whole file is
        checked before anything is added. Returns how many were added.
        Raises :class:`MemoryFileError` naming the file and line when it is malformed."""
        return self._add_new(read_memory_file(path))


def read_memory_file(path: str | os.PathLike[str]) -> list[Conclusion]:
    """Parse and check a memory file; blank lines are allowed. MemoryFileError otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MemoryFileError(path, "no such memory file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MemoryFileError(path, f"cannot read the memory file: {exc}") from exc
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not numbered:
        raise MemoryFileError(path, 'empty file; a memory file starts {"kernelarc_memory": 1}')
    n, header = numbered[0]
    try:
        head = json.loads(header)
    except json.JSONDecodeError as exc:
        raise MemoryFileError(path, f"header is not JSON ({exc.msg})", line=n) from None
    if not isinstance(head, dict) or "kernelarc_memory" not in head:
        raise MemoryFileError(
            path, 'not a memory file: the first line must be {"kernelarc_memory": 1}', line=n
        )
    if head["kernelarc_memory"] != MEMORY_FORMAT:
        raise MemoryFileError(
            path,
            f"memory format {head['kernelarc_memory']!r} is not supported "
            f"(this version reads {MEMORY_FORMAT})",
            line=n,
        )
    out: list[Conclusion] = []
    for n, line in numbered[1:]:
        try:
            c = Conclusion.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "line"
            raise MemoryFileError(
                path, f"not a valid conclusion ({field}: {first['msg']})", line=n
            ) from None
        try:
            check_claim(c)
        except ValueError as exc:
            raise MemoryFileError(path, str(exc), line=n) from None
        out.append(c)
    return out
