"""Tests of the coordination state: conclusions memory, board and plateau tracking."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kernelarc.agents.board import Board
from kernelarc.agents.memory import ConclusionMemory, MemoryFileError, jaccard
from kernelarc.agents.plateau import PlateauTracker, drafting_seed
from kernelarc.agents.types import BoardSnapshot, Conclusion, IncumbentView, Outcome
from kernelarc.problem.schema import Solution

# ---------------------------------------------------------------- helpers


def solution(name: str = "s") -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "d",
            "author": "a",
            "spec": {"languages": ["pytorch"], "entry_point": "m.py::run"},
            "sources": [{"path": "m.py", "content": "def run(x):\n    return x\n"}],
        }
    )


def view(agent: str, strategy: str, score: float, cid: str | None = None) -> IncumbentView:
    return IncumbentView(
        agent=agent,
        strategy=strategy,
        candidate_id=cid or f"{agent}-{score}",
        score=score,
        latencies_ms={"w0": 1.0 / score, "w1": 2.0 / score},
        solution=solution(f"{agent}-sol"),
    )


def concl(
    claim: str = "split-K 4 wins for M<=64",
    *,
    agent: str = "a1",
    strategy: str = "triton",
    outcome: Outcome = "improved",
    tags: tuple[str, ...] = (),
    cid: str | None = None,
    **kw: Any,
) -> Conclusion:
    return Conclusion(
        agent=agent,
        strategy=strategy,
        candidate_id=cid or f"c-{claim}",
        claim=claim,
        tags=tags,
        outcome=outcome,
        **kw,
    )


# ---------------------------------------------------------------- memory: writing


def test_add_assigns_write_order_and_copies() -> None:
    mem = ConclusionMemory()
    original = concl("a", seq=77, effect={"small": 1.2})
    mem.add(original)
    mem.add(concl("b", seq=3))
    held = mem.all()
    assert len(mem) == 2
    assert [c.claim for c in held] == ["a", "b"]
    assert [c.seq for c in held] == [1, 2]
    assert held[0].effect == {"small": 1.2}
    # changing what was passed in or handed out does not reach the memory
    original.effect["small"] = 9.0
    held[0].effect["small"] = 5.0
    assert mem.all()[0].effect == {"small": 1.2}


@pytest.mark.parametrize(
    "claim",
    [
        "def kernel(x): return x",
        "use: import triton first",
        "@triton.jit on the matmul helps",
        "__global__ void k() wins",
        "```python x``` was faster",
        "line one\nline two\nline three",
        "#include <cuda.h> then fuse",
    ],
)
def test_add_rejects_code(claim: str) -> None:
    mem = ConclusionMemory()
    with pytest.raises(ValueError, match="never code"):
        mem.add(concl(claim))
    assert len(mem) == 0


@pytest.mark.parametrize(
    "claim",
    [
        "important: BLOCK_M=64 beats 128 for M<=64 on K=14336",
        "two lines are fine\nas long as it is a lesson",
        "undefined behaviour avoided by fp32 accumulation",
    ],
)
def test_add_accepts_lessons(claim: str) -> None:
    mem = ConclusionMemory()
    mem.add(concl(claim))
    assert mem.all()[0].claim == claim


def test_claim_length_is_capped_by_the_model() -> None:
    with pytest.raises(ValidationError):
        concl("x" * 301)


def test_bad_parameters() -> None:
    for cap in (0, -1):
        with pytest.raises(ValueError, match="capacity"):
            ConclusionMemory(cap)
    with pytest.raises(ValueError, match="half_life"):
        ConclusionMemory(half_life=0.0)
    with pytest.raises(ValueError, match="k >= 0"):
        ConclusionMemory().top_k("a", "s", (), k=-1)


def test_eviction_prefers_oldest_low_value() -> None:
    mem = ConclusionMemory(capacity=4)
    mem.add(concl("i1", outcome="improved"))
    mem.add(concl("n1", outcome="no_gain"))
    mem.add(concl("r1", outcome="regressed"))
    mem.add(concl("f1", outcome="failed"))
    mem.add(concl("i2", outcome="improved"))  # evicts n1 (oldest of no_gain/failed)
    assert [c.claim for c in mem.all()] == ["i1", "r1", "f1", "i2"]
    mem.add(concl("i3", outcome="improved"))  # evicts f1
    assert [c.claim for c in mem.all()] == ["i1", "r1", "i2", "i3"]
    mem.add(concl("n2", outcome="no_gain"))  # no low-value held: oldest overall (i1)
    assert [c.claim for c in mem.all()] == ["r1", "i2", "i3", "n2"]
    assert len(mem) == 4


# ---------------------------------------------------------------- memory: ranking


def test_jaccard() -> None:
    assert jaccard(["a", "b"], ["b", "c"]) == pytest.approx(1 / 3)
    assert jaccard([], []) == 0.0
    assert jaccard(["a"], ["a", "a"]) == 1.0


def test_score_formula_on_one_entry() -> None:
    mem = ConclusionMemory(half_life=10.0)
    mem.add(concl("old", agent="a2", tags=("mem-bound", "small-M"), outcome="regressed"))
    for i in range(4):
        mem.add(concl(f"filler {i}", agent="a1", strategy="other"))
    old = mem.all()[0]
    got = mem.score(old, agent="a1", strategy="triton", tags=["small-M", "fp16"])
    expected = 1 / 3 + 1.0 + 0.5 + 0.6 + math.exp(-4 / 10.0)
    assert got == pytest.approx(expected)
    own = mem.score(old, agent="a2", strategy="x", tags=[])
    assert own == pytest.approx(0.6 + math.exp(-0.4))


def _claims(cs: tuple[Conclusion, ...]) -> list[str]:
    return [c.claim for c in cs]


def test_top_k_each_component_orders() -> None:
    huge = 1e18  # recency is exactly 1.0 for every entry: relevance alone decides
    # same strategy beats another strategy
    mem = ConclusionMemory(half_life=huge)
    mem.add(concl("same", strategy="triton"))
    mem.add(concl("other", strategy="compile"))
    assert _claims(mem.top_k("me", "triton", ())) == ["same", "other"]
    # another agent's lesson beats one's own
    mem = ConclusionMemory(half_life=huge)
    mem.add(concl("theirs", agent="a2"))
    mem.add(concl("mine", agent="me"))
    assert _claims(mem.top_k("me", "triton", ())) == ["theirs", "mine"]
    # outcome weights: improved > regressed > failed > no_gain
    mem = ConclusionMemory(half_life=huge)
    for o in ("no_gain", "failed", "improved", "regressed"):
        mem.add(concl(o, outcome=o))  # type: ignore[arg-type]
    assert _claims(mem.top_k("me", "triton", ())) == ["improved", "regressed", "failed", "no_gain"]
    # tag overlap
    mem = ConclusionMemory(half_life=huge)
    mem.add(concl("none", tags=("x",)))
    mem.add(concl("half", tags=("a", "x")))
    mem.add(concl("full", tags=("a", "b")))
    assert _claims(mem.top_k("me", "triton", ("a", "b"))) == ["full", "half", "none"]


def test_top_k_recency_and_tie_break() -> None:
    mem = ConclusionMemory(half_life=5.0)
    for i in range(6):
        mem.add(concl(f"c{i}"))
    assert _claims(mem.top_k("me", "triton", (), k=3)) == ["c5", "c4", "c3"]
    # exact ties (recency saturated): newest seq first
    mem = ConclusionMemory(half_life=1e18)
    for i in range(4):
        mem.add(concl(f"t{i}"))
    assert _claims(mem.top_k("me", "triton", ())) == ["t3", "t2", "t1", "t0"]


def test_top_k_relevance_can_beat_recency() -> None:
    mem = ConclusionMemory(half_life=50.0)
    mem.add(concl("relevant old", agent="a2", tags=("gemm", "bf16")))
    for i in range(5):
        mem.add(concl(f"new but unrelated {i}", agent="me", strategy="x", outcome="no_gain"))
    top = mem.top_k("me", "triton", ("gemm", "bf16"), k=1)
    assert _claims(top) == ["relevant old"]


def test_top_k_bounds_and_copies() -> None:
    mem = ConclusionMemory()
    assert mem.top_k("me", "s", ("a",)) == ()
    mem.add(concl("one", effect={"w": 1.5}))
    mem.add(concl("two"))
    assert mem.top_k("me", "triton", (), k=0) == ()
    assert len(mem.top_k("me", "triton", (), k=10)) == 2
    got = mem.top_k("me", "triton", (), k=2)
    next(c for c in got if c.claim == "one").effect["w"] = 0.0
    assert next(c for c in mem.all() if c.claim == "one").effect == {"w": 1.5}


# ---------------------------------------------------------------- memory: files


def test_save_load_round_trip(tmp_path: Path) -> None:
    src = ConclusionMemory()
    src.add(concl("a", effect={"m<=64": 1.3}, tags=("gemm",)))
    src.add(concl("b", agent="a2", outcome="failed"))
    path = tmp_path / "memory.jsonl"
    src.save(path)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"kernelarc_memory": 1}
    assert len(lines) == 3

    dst = ConclusionMemory()
    dst.add(concl("already here"))
    dst.add(concl("and this"))
    assert dst.load(path) == 2
    held = dst.all()
    assert [c.claim for c in held] == ["already here", "and this", "a", "b"]
    assert [c.seq for c in held] == [1, 2, 3, 4]  # fresh seqs after the current ones
    for before, after in zip(src.all(), held[2:], strict=True):
        assert before.model_dump(exclude={"seq"}) == after.model_dump(exclude={"seq"})
    # loading the same lessons again adds nothing
    assert dst.load(path) == 0
    assert len(dst) == 4


def test_load_respects_capacity(tmp_path: Path) -> None:
    src = ConclusionMemory()
    for i in range(5):
        src.add(concl(f"l{i}", outcome="no_gain" if i % 2 else "improved"))
    path = tmp_path / "m.jsonl"
    src.save(path)
    dst = ConclusionMemory(capacity=3)
    assert dst.load(path) == 5
    assert [c.claim for c in dst.all()] == ["l0", "l2", "l4"]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("lines", "line_no", "fragment"),
    [
        (['{"other": 1}'], 1, "not a memory file"),
        (["not json"], 1, "header is not JSON"),
        (['{"kernelarc_memory": 2}'], 1, "not supported"),
        (['{"kernelarc_memory": 1}', "{broken"], 2, "not a valid conclusion"),
        (['{"kernelarc_memory": 1}', "", '{"agent": "a"}'], 3, "not a valid conclusion"),
    ],
)
def test_load_malformed(tmp_path: Path, lines: list[str], line_no: int, fragment: str) -> None:
    path = _write(tmp_path / "bad.jsonl", lines)
    mem = ConclusionMemory()
    with pytest.raises(MemoryFileError, match=fragment) as info:
        mem.load(path)
    assert str(info.value).startswith(f"{path}:{line_no}: ")
    assert info.value.line == line_no


def test_load_rejects_code_and_is_all_or_nothing(tmp_path: Path) -> None:
    good = concl("fine lesson").model_dump_json()
    bad = concl("def f(): pass", cid="c2").model_dump_json()
    path = _write(tmp_path / "m.jsonl", ['{"kernelarc_memory": 1}', good, bad])
    mem = ConclusionMemory()
    with pytest.raises(MemoryFileError, match="never code") as info:
        mem.load(path)
    assert info.value.line == 3
    assert len(mem) == 0


def test_load_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(MemoryFileError, match="no such memory file"):
        ConclusionMemory().load(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(MemoryFileError, match="empty file"):
        ConclusionMemory().load(tmp_path / "empty.jsonl")


def test_merge() -> None:
    a, b = ConclusionMemory(), ConclusionMemory()
    a.add(concl("shared"))
    a.add(concl("only a"))
    b.add(concl("shared"))
    b.add(concl("only b", agent="a2"))
    assert a.merge(b) == 1
    assert [c.claim for c in a.all()] == ["shared", "only a", "only b"]
    assert a.all()[-1].seq == 3
    assert a.merge(a) == 0
    assert len(b) == 2  # the source is untouched


# ---------------------------------------------------------------- board


def test_board_update_snapshot_version() -> None:
    board = Board()
    assert board.snapshot() == BoardSnapshot(incumbents=(), version=0)
    assert board.incumbent("a1") is None
    board.update(view("a1", "triton", 1.5), owner="a1")
    board.update(view("a2", "compile", 2.0), owner="a2")
    board.update(view("a1", "triton", 1.8), owner="a1")
    snap = board.snapshot()
    assert snap.version == 3 == board.version
    assert [(v.agent, v.score) for v in snap.incumbents] == [("a1", 1.8), ("a2", 2.0)]
    assert board.agents() == ("a1", "a2") and len(board) == 2
    got = board.incumbent("a1")
    assert got is not None and got.score == 1.8
    best = snap.best()
    assert best is not None and best.agent == "a2"
    assert [v.agent for v in snap.others("a1")] == ["a2"]


def test_board_keeps_each_agents_last_replaced_incumbents() -> None:
    """A replaced incumbent moves to ``former`` (newest first), at most
    ``Board.FORMER_PER_AGENT`` per agent; re-writing the same candidate moves nothing;
    ``others(agent, former=True)`` adds other agents' former entries after the current."""
    board = Board()
    for score in (1.1, 1.2, 1.3, 1.4, 1.5):
        board.update(view("a1", "precision", score), owner="a1")
    board.update(view("a2", "graph", 2.0), owner="a2")
    board.update(view("a2", "graph", 2.0), owner="a2")  # the same candidate again
    board.update(view("a2", "graph", 2.5), owner="a2")
    snap = board.snapshot()
    keep = Board.FORMER_PER_AGENT
    assert keep == 3
    assert [(v.agent, v.score) for v in snap.former] == [
        ("a2", 2.0),
        ("a1", 1.4),
        ("a1", 1.3),
        ("a1", 1.2),
    ]
    assert [(v.agent, v.score) for v in snap.incumbents] == [("a1", 1.5), ("a2", 2.5)]
    assert [v.score for v in snap.others("a2")] == [1.5]
    assert [v.score for v in snap.others("a2", former=True)] == [1.5, 1.4, 1.3, 1.2]
    assert snap.best() is not None and snap.best().score == 2.5  # type: ignore[union-attr]
    snap.former[0].latencies_ms.clear()
    assert board.snapshot().former[0].latencies_ms == {"w0": 1.0 / 2.0, "w1": 2.0 / 2.0}


def test_board_owner_only() -> None:
    board = Board()
    board.update(view("a1", "triton", 1.5), owner="a1")
    with pytest.raises(PermissionError) as info:
        board.update(view("a1", "triton", 9.0), owner="a2")
    assert "'a2'" in str(info.value) and "'a1'" in str(info.value)
    got = board.incumbent("a1")
    assert got is not None and got.score == 1.5
    assert board.version == 1
    with pytest.raises(TypeError):
        board.update({"agent": "a1"}, owner="a1")  # type: ignore[arg-type]


def test_old_snapshot_unchanged_after_updates() -> None:
    board = Board()
    board.update(view("a1", "triton", 1.5), owner="a1")
    old = board.snapshot()
    frozen = old.model_dump()
    board.update(view("a1", "triton", 3.0), owner="a1")
    board.update(view("a2", "compile", 2.0), owner="a2")
    assert old.model_dump() == frozen
    assert old.version == 1 and len(old.incumbents) == 1
    assert board.snapshot().version == 3


def test_snapshot_cannot_be_mutated() -> None:
    board = Board()
    board.update(view("a1", "triton", 1.5), owner="a1")
    snap = board.snapshot()
    with pytest.raises(TypeError):
        snap.incumbents[0] = view("a2", "x", 9.0)  # type: ignore[index]
    with pytest.raises(ValidationError):
        snap.incumbents[0].score = 99.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        snap.version = 42  # type: ignore[misc]
    with pytest.raises(ValidationError):
        snap.incumbents = ()  # type: ignore[misc]


def test_mutable_leaves_do_not_leak() -> None:
    """The dict and the Solution inside a view are mutable types; the board copies them."""
    board = Board()
    passed = view("a1", "triton", 1.5)
    board.update(passed, owner="a1")
    passed.latencies_ms["w0"] = 0.0
    passed.solution.sources[0].content = "tampered"
    snap = board.snapshot()
    snap.incumbents[0].latencies_ms["w1"] = 0.0
    snap.incumbents[0].solution.name = "tampered"
    got = board.incumbent("a1")
    assert got is not None
    got.latencies_ms.clear()
    for v in (board.snapshot().incumbents[0], board.incumbent("a1")):
        assert v is not None
        assert v.latencies_ms == {"w0": 1.0 / 1.5, "w1": 2.0 / 1.5}
        assert v.solution.name == "a1-sol"
        assert v.solution.sources[0].content.startswith("def run")


# ---------------------------------------------------------------- plateau


def test_patience_must_be_positive() -> None:
    for p in (0, -3):
        with pytest.raises(ValueError, match="patience"):
            PlateauTracker(p)


def test_plateau_counts_and_reset() -> None:
    t = PlateauTracker(3)
    assert not t.must_draft("a1")
    t.record("a1", improved=False)
    t.record("a1", improved=False)
    assert not t.must_draft("a1") and t.count("a1") == 2
    t.record("a1", improved=True)  # a gain clears the count
    assert t.count("a1") == 0
    for _ in range(3):
        t.record("a1", improved=False)
    t.record("a2", improved=False)
    assert t.must_draft("a1") and not t.must_draft("a2")
    t.record("a1", improved=False)  # still plateaued until reset
    assert t.must_draft("a1") and t.count("a1") == 4
    t.reset("a1")
    assert not t.must_draft("a1") and t.count("a2") == 1


def test_plateau_state_round_trip() -> None:
    t = PlateauTracker(2)
    t.record("a1", improved=False)
    t.record("a1", improved=False)
    t.record("a2", improved=False)
    state = json.loads(json.dumps(t.state()))
    fresh = PlateauTracker(2)
    fresh.restore(state)
    assert fresh.must_draft("a1") and not fresh.must_draft("a2")
    assert fresh.count("a2") == 1
    with pytest.raises(ValueError, match="patience 2"):
        PlateauTracker(5).restore(state)
    bad_states: list[dict[str, Any]] = [
        {"patience": 2, "counts": {"a1": -1}},
        {"counts": {}},
        {"patience": 2, "x": 1},
    ]
    for bad in bad_states:
        with pytest.raises(ValueError, match="malformed plateau state"):
            PlateauTracker(2).restore(bad)


def test_drafting_seed() -> None:
    board = Board()
    assert drafting_seed(board.snapshot(), "me", "triton") is None
    board.update(view("me", "triton", 9.0), owner="me")
    assert drafting_seed(board.snapshot(), "me", "triton") is None  # never one's own
    board.update(view("twin", "triton", 5.0), owner="twin")
    seed = drafting_seed(board.snapshot(), "me", "triton")
    assert seed is not None and seed.agent == "twin"  # same strategy is the fallback
    board.update(view("c1", "compile", 1.2), owner="c1")
    board.update(view("c2", "cudagraph", 2.5), owner="c2")
    seed = drafting_seed(board.snapshot(), "me", "triton")
    # a different family wins over a better same-family incumbent; best of those
    assert seed is not None and seed.agent == "c2"
    seed = drafting_seed(board.snapshot(), "c2", "cudagraph")
    assert seed is not None and seed.agent == "me"
