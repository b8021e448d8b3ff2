"""The compiler agent's choices without a guard: the board incumbents it compiles (bases
compared with bases, former incumbents, rebasing a stale proposal, walking configurations
on the base whose compile won), its conclusions (effect by workload class, outcomes,
relative to its own incumbent), drafting (family switch, the static variant, the board
compile's setup, the reference compiled first, reduce-overhead's fresh outputs, the
compiled source) and its state round trip.

Covered on the bundled example ``rmsnorm_h512`` with synthetic verdicts
(``tests/data/compiler_agent.py``); one static variant compiles every shape for real.
Not covered: a board candidate judged by the guard (test_builtin_agents.py), CUDA.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _shared import agent_context, incumbent_view
from data.compiler_agent import (
    MAX_AUTOTUNE,
    after_plain,
    all_proposals,
    board_views,
    compiler_after_one_proposal,
    synthetic,
    wr,
)

from kernelarc.agents.types import (
    BoardSnapshot,
    IncumbentView,
)
from kernelarc.examples import example_dir
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.proposers.compiler import (
    BASELINE,
    COMPILE_VARIANTS,
    CompilerAgent,
    compiled_base_solution,
    compiled_source,
)
from kernelarc.proposers.reference import ReferenceAgent


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


def test_compiler_compares_bases_with_bases(problem: Problem) -> None:
    """A board base qualifies when it is better, uncompiled, than the base of the compiler's
    best compile: a compiled reference at 9x does not block a 2x policy (the reference is
    1x). Once that base's compile won, a weaker base is left (the walk goes on) and a
    stronger one is compiled."""
    views = board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    tf32 = views[0].solution
    won = [wr("w1", 1, 0.5, 1.0)]
    mine = views[0].model_copy(update={"agent": "compiler", "candidate_id": "c9", "score": 9.0})
    board = BoardSnapshot(incumbents=views, version=3)
    agent = after_plain(problem, board=board, incumbent=mine)
    first = agent.propose(agent_context(problem, board=board, incumbent=mine))
    assert first is not None and first.parent_id == "c3" and first.tags[-1] == "board"
    agent.observe(synthetic(won, improved=True))
    mine = mine.model_copy(update={"candidate_id": "c10", "score": 12.0})
    weaker = incumbent_view("rewrite", "c4", 1.5, tf32.model_copy(update={"name": "w"}))
    board = BoardSnapshot(incumbents=(*views, weaker), version=4)
    walk = agent.propose(agent_context(problem, board=board, incumbent=mine))
    assert walk is not None and walk.tags == ("compiler", "static", "board")
    assert walk.parent_id == "c3", "the walk on the winning base, not the weaker base"
    agent.observe(synthetic(won))
    stronger = incumbent_view("rewrite", "c6", 2.5, tf32.model_copy(update={"name": "s"}))
    board = BoardSnapshot(incumbents=(*views, stronger), version=5)
    nxt = agent.propose(agent_context(problem, board=board, incumbent=mine))
    assert nxt is not None and nxt.parent_id == "c6"
    assert nxt.tags == ("compiler", "default", "board")
    with pytest.raises(ValueError, match="'bases'"):
        CompilerAgent().restore({"bases": "c3"})


def test_compiler_compiles_a_former_incumbent_the_current_one_hides(problem: Problem) -> None:
    """When an agent's new incumbent cannot be compiled (a policy around a CUDA graph), its
    former one (the policy around the reference) is still a base, not a weaker incumbent
    of another agent."""
    from kernelarc.proposers.precision import policy_named, policy_solution

    views = board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    graph = views[1].solution
    around = policy_solution(graph, problem.definition, policy_named("tf32"), name="pg", what="g")
    on_graph = incumbent_view("precision", "c8", 3.5, around)
    weaker = incumbent_view(
        "rewrite", "c4", 1.5, views[0].solution.model_copy(update={"name": "w"})
    )
    board = BoardSnapshot(incumbents=(on_graph, views[1], weaker), version=4, former=(views[0],))
    agent = after_plain(problem, board=board, incumbent=None)
    proposal = agent.propose(agent_context(problem, board=board, incumbent=None))
    assert proposal is not None and proposal.parent_id == "c3", proposal
    assert proposal.tags == ("compiler", "default", "board")
    without = BoardSnapshot(incumbents=board.incumbents, version=4)
    other = after_plain(problem, board=without, incumbent=None)
    fallback = other.propose(agent_context(problem, board=without, incumbent=None))
    assert fallback is not None and fallback.parent_id == "c4", "only the current: rewrite's"


def test_compiler_rebases_a_stale_proposal_onto_a_better_board_incumbent(
    problem: Problem,
) -> None:
    """The reference's default compile (torch.compile's baseline) is never rebased. The next
    configuration, proposed on an empty board, is: once a better incumbent is on the board,
    ``rebase`` compiles that instead and the configuration comes back later; a board proposal
    moves to a still better base only; drafts stay."""
    views = board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    agent = CompilerAgent()
    empty = agent_context(problem, board=BoardSnapshot(version=0), incumbent=None)
    board = BoardSnapshot(incumbents=views[:1], version=1)
    plain = agent.propose(empty)
    assert plain is not None and plain.tags == ("compiler", "static") and plain.parent_id is None
    assert agent.rebase(plain, agent_context(problem, board=board, incumbent=None)) is None
    agent.observe(synthetic([wr("w1", 1, 0.9, 1.0)]))
    stale = agent.propose(empty)
    assert stale is not None and stale.tags == ("compiler", MAX_AUTOTUNE)
    assert agent.rebase(stale, empty) is None  # nothing better on the board
    now = agent.rebase(stale, agent_context(problem, board=board, incumbent=None))
    assert now is not None and now.parent_id == "c3" and now.tags[-1] == "board"
    assert agent.state()["tried"] == ["static"] and agent.state()["pending_base"] == "c3"
    # The same base again, or a weaker one, is no reason to rebase a board proposal.
    assert agent.rebase(now, agent_context(problem, board=board, incumbent=None)) is None
    tf32 = views[0].solution
    better = incumbent_view("fp8-gemm", "c8", 4.0, tf32.model_copy(update={"name": "b"}))
    board2 = BoardSnapshot(incumbents=(views[0], better), version=2)
    moved = agent.rebase(now, agent_context(problem, board=board2, incumbent=None))
    assert moved is not None and moved.parent_id == "c8"
    assert agent.state()["bases"] == ["c8"], "c3 may be compiled later"
    nxt = agent.propose(agent_context(problem, board=BoardSnapshot(version=2), incumbent=None))
    assert nxt is not None and nxt.tags == ("compiler", MAX_AUTOTUNE), "the configuration is back"
    draft = nxt.model_copy(update={"mode": "draft"})
    assert agent.rebase(draft, agent_context(problem, board=board2, incumbent=None)) is None


def test_compiler_walks_its_configurations_on_the_base_whose_compile_won(
    problem: Problem,
) -> None:
    """Once the default compile of a board base becomes the compiler's incumbent, the next
    configurations (shape-specialised next) compile that base, not the reference; a draft
    still starts from the reference; the walk survives a state round trip, and a walk
    proposal rebased onto a better board base comes back afterwards. A board compile that
    does not win leaves the walk on the reference."""
    views = board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    board = BoardSnapshot(incumbents=views[:1], version=1)
    won = [wr("w1", 1, 0.5, 1.0)]

    loser = after_plain(problem, board=board, incumbent=None)
    assert loser.propose(agent_context(problem, board=board, incumbent=None)).parent_id == "c3"
    loser.observe(synthetic(won, improved=False))
    nxt = loser.propose(agent_context(problem, board=board, incumbent=None))
    assert nxt is not None and nxt.tags == ("compiler", MAX_AUTOTUNE) and nxt.parent_id is None

    agent = after_plain(problem, board=board, incumbent=None)
    first = agent.propose(agent_context(problem, board=board, incumbent=None))
    assert first is not None and first.tags == ("compiler", "default", "board")
    agent.observe(synthetic(won, improved=True))
    mine = incumbent_view("compiler", "c7", 2.5, first.solution)
    ctx = agent_context(problem, board=board, incumbent=mine)
    walk = agent.propose(ctx)
    assert walk is not None and walk.tags == ("compiler", "static", "board"), walk.tags
    assert walk.parent_id == "c3" and walk.mode == "refine"
    wrapper = walk.solution.sources[-1].content
    assert "torch.compile(_ka_base, dynamic=False, fullgraph=False)" in wrapper
    assert "recompile_limit" in wrapper

    twin = CompilerAgent()
    twin.restore(json.loads(json.dumps(agent.state())))
    assert twin.state() == agent.state()
    better = incumbent_view(
        "rewrite", "c8", 4.0, views[0].solution.model_copy(update={"name": "b"})
    )
    board2 = BoardSnapshot(incumbents=(views[0], better), version=2)
    moved = twin.rebase(walk, agent_context(problem, board=board2, incumbent=mine))
    assert moved is not None and moved.parent_id == "c8" and moved.tags[-1] == "board"
    twin.observe(synthetic(won, improved=False))
    back = twin.propose(agent_context(problem, board=board2, incumbent=mine))
    assert back is not None and back.tags == ("compiler", "static", "board"), "put back"
    assert back.parent_id == "c3"

    agent.observe(synthetic(won, improved=False))
    draft = agent.propose(agent_context(problem, board=board, incumbent=mine, must_draft=True))
    assert draft is not None and draft.mode == "draft" and draft.tags[-1] != "board"
    with pytest.raises(ValueError, match="'on'"):
        CompilerAgent().restore({"on": {"agent": 1}})


# ------------------------------------------------------------------------------ conclusions


def test_compiler_conclusion_effect_by_class(problem: Problem) -> None:
    agent = compiler_after_one_proposal(problem)
    per = [
        wr("a", 1, 1.0, 1.0),
        wr("b", 16, 1.0, 2.0),
        wr("c", 128, 1.0, 4.0),
    ]
    conclusion = agent.observe(synthetic(per, improved=True))
    # median_low of batch sizes 1, 3, 16, 64, 128, 257 is 16.
    assert conclusion.effect == {
        "large: batch_size>16": pytest.approx(4.0, rel=1e-3),
        "small: batch_size<=16": pytest.approx(math.sqrt(2.0), rel=1e-3),
    }
    assert conclusion.outcome == "improved" and len(conclusion.claim) <= 300
    assert "2.00x over eager on 3/3 workloads" in conclusion.claim
    assert "best on large: batch_size>16" in conclusion.claim


def test_compiler_outcomes(problem: Problem) -> None:
    slow = [wr("a", 1, 2.0, 1.0), wr("b", 128, 2.0, 1.0)]
    assert compiler_after_one_proposal(problem).observe(synthetic(slow)).outcome == "regressed"
    even = [wr("a", 1, 1.0, 1.0), wr("b", 128, 1.0, 1.0)]
    assert compiler_after_one_proposal(problem).observe(synthetic(even)).outcome == "no_gain"
    bad = [
        wr("a", 1, None, 1.0, status="RUNTIME_ERROR"),
        wr("b", 128, 1.0, 1.0),
    ]
    c = compiler_after_one_proposal(problem).observe(synthetic(bad))
    assert c.outcome == "failed" and "failed on 1/2 workloads (RUNTIME_ERROR)" in c.claim
    assert c.effect == {"large: batch_size>16": 1.0}


def test_effect_is_relative_to_own_incumbent(problem: Problem) -> None:
    ref = ReferenceAgent().propose(agent_context(problem))
    assert ref is not None
    mine = IncumbentView(
        agent="compiler",
        strategy="compiler",
        candidate_id="c3",
        score=1.0,
        latencies_ms={"a": 2.0, "b": 2.0},
        solution=ref.solution,
    )
    agent = CompilerAgent()
    proposal = agent.propose(agent_context(problem, incumbent=mine))
    assert proposal is not None and proposal.parent_id == "c3" and proposal.mode == "refine"
    per = [wr("a", 1, 1.0, 1.0), wr("b", 128, 1.0, 1.0)]
    conclusion = agent.observe(synthetic(per))
    assert conclusion.effect == {"large: batch_size>16": 2.0, "small: batch_size<=16": 2.0}
    assert "2.00x vs own previous best" in conclusion.claim


# ------------------------------------------------------------------------------ drafting


def test_must_draft_switches_family_and_links_to_the_board(problem: Problem) -> None:
    ref = ReferenceAgent().propose(agent_context(problem))
    assert ref is not None

    def view(agent: str, cid: str, score: float) -> IncumbentView:
        entry: IncumbentView = incumbent_view(agent, cid, score, ref.solution)
        return entry

    board = BoardSnapshot(
        incumbents=(view("compiler", "c9", 9.0), view("llm", "c2", 1.5), view("x", "c4", 1.2))
    )
    agent = CompilerAgent()
    first = agent.propose(agent_context(problem, board=board))
    assert first is not None and first.tags == ("compiler", "static") and first.mode == "refine"
    draft = agent.propose(agent_context(problem, board=board, must_draft=True))
    assert draft is not None and draft.mode == "draft"
    assert draft.tags == ("compiler", "coordinate-descent")
    assert draft.parent_id == "c2", "the best incumbent of *another* agent"
    assert "coordinate_descent_tuning" in draft.solution.sources[0].content
    # Refining resumes after the drafted configuration; a second draft switches back.
    assert agent.propose(agent_context(problem)).tags == ("compiler", "epilogue-fusion")
    again = agent.propose(agent_context(problem, must_draft=True))
    assert again is not None and again.tags == ("compiler", "default") and again.parent_id is None
    rest = [p.tags[1] for p in all_proposals(agent, problem)]
    assert rest == ["max-autotune-no-cudagraphs"]


def test_static_variant_compiles_every_shape(tmp_path: Path) -> None:
    """The shape-specialised configuration compiles one graph for each of 10 shapes; with
    Dynamo's default limit (8) the 9th and 10th would run eagerly. In a subprocess: the
    solution raises process-wide Dynamo limits."""
    import subprocess
    import sys

    variant = next(v for v in COMPILE_VARIANTS if v.name == "static")
    assert variant.specialises() and "recompile_limit" in variant.setup()
    reference = "import torch\n\n\ndef run(x):\n    return x * 2 + 1\n"
    (tmp_path / "solution.py").write_text(compiled_source(reference, variant))
    probe = (
        "import torch, solution\n"
        "from torch._dynamo.utils import counters\n"
        "for n in range(1, 11):\n"
        "    y = solution.kernelarc_entry(torch.ones(n, 4))\n"
        "    assert torch.equal(y, torch.full((n, 4), 3.0))\n"
        "print(counters['stats']['unique_graphs'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "10", out.stdout


def _board_compile_text(problem: Problem, variant_name: str) -> str:
    """All sources of the compiler's board compile of the reference's solution under one
    configuration."""
    variant = next(v for v in COMPILE_VARIANTS if v.name == variant_name)
    base = ReferenceAgent().propose(agent_context(problem))
    assert base is not None
    sol = compiled_base_solution(base.solution, problem.definition, variant, name="x", what="a")
    return "\n".join(s.content for s in sol.sources)


def test_board_compile_carries_the_setup(problem: Problem) -> None:
    variant = next(v for v in COMPILE_VARIANTS if v.name == "static")
    text = _board_compile_text(problem, "static")
    assert variant.setup() in text
    assert text.index("recompile_limit") < text.index("torch.compile(_ka_base, dynamic=False")


def test_compiler_first_compiles_the_reference_whatever_the_board(problem: Problem) -> None:
    """The first proposal is torch.compile's own baseline (the reference, default settings)
    even with better board incumbents to compile, and no board change rebases it; the
    board's base comes next. The flag survives a state round trip."""
    board = BoardSnapshot(incumbents=board_views(problem), version=3)
    ctx = agent_context(problem, board=board, incumbent=None)
    agent = CompilerAgent()
    plain = agent.propose(ctx)
    assert plain is not None and plain.tags == ("compiler", BASELINE) == ("compiler", "static")
    static = next(v for v in COMPILE_VARIANTS if v.name == "static")
    assert compiled_source(problem.definition.reference, static) == (
        plain.solution.sources[0].content
    )
    assert agent.rebase(plain, ctx) is None
    twin = CompilerAgent()
    twin.restore(json.loads(json.dumps(agent.state())))
    assert twin.state()["plain"] is True
    agent.observe(synthetic([wr("w1", 1, 0.9, 1.0)]))
    nxt = agent.propose(ctx)
    assert nxt is not None and nxt.tags == ("compiler", "default", "board")
    with pytest.raises(ValueError, match="'plain'"):
        CompilerAgent().restore({"plain": "yes"})


def test_reduce_overhead_entry_returns_fresh_outputs(problem: Problem) -> None:
    """Inductor's CUDA graphs write each call's outputs into the same buffers; the
    reduce-overhead entry hands out copies, for a tensor and for a tuple. A stand-in for
    the compiled function (a named fake: no CUDA here) reuses one buffer like a graph."""
    variant = next(v for v in COMPILE_VARIANTS if v.name == "reduce-overhead")
    assert variant.fresh_outputs and not COMPILE_VARIANTS[0].fresh_outputs
    buffer = torch.zeros(3)

    def graph_like(x: torch.Tensor, pair: bool = False):
        buffer.copy_(x)
        return (buffer, 7) if pair else buffer

    space: dict[str, object] = {"torch": torch, "_fake_graph": graph_like}
    exec(variant.entry("_fake_graph"), space)
    entry = space["kernelarc_entry"]
    first = entry(torch.ones(3))
    second = entry(torch.full((3,), 2.0))
    assert torch.equal(first, torch.ones(3)), "the first output changed under the caller"
    assert torch.equal(second, torch.full((3,), 2.0))
    out, seven = entry(torch.full((3,), 5.0), True)
    entry(torch.zeros(3))
    assert torch.equal(out, torch.full((3,), 5.0)) and seven == 7
    src = compiled_source(problem.definition.reference, variant)
    assert "mode='reduce-overhead'" in src and "return out.clone()" in src
    assert "out = _ka_compiled(*args)" in _board_compile_text(problem, "reduce-overhead")


def test_compiled_source_text(problem: Problem) -> None:
    variant = next(v for v in COMPILE_VARIANTS if v.name == "epilogue-fusion")
    src = compiled_source(problem.definition.reference, variant)
    assert src.startswith(problem.definition.reference.rstrip())
    assert (
        "_compiled = torch.compile(run, options={'epilogue_fusion': True, 'max_autotune': False})"
        in src
    )
    assert "def kernelarc_entry(*args):\n    return _compiled(*args)\n" in src


# ------------------------------------------------------------------------------ state


def test_compiler_state_round_trip(problem: Problem) -> None:
    agent = CompilerAgent()
    agent.propose(agent_context(problem))
    agent.propose(agent_context(problem, must_draft=True))
    saved = json.loads(json.dumps(agent.state()))
    twin = CompilerAgent()
    twin.restore(saved)
    assert twin.state() == agent.state()
    a, b = agent.propose(agent_context(problem)), twin.propose(agent_context(problem))
    assert a is not None and b is not None and a.solution == b.solution
    with pytest.raises(ValueError, match="unknown configuration"):
        CompilerAgent().restore({"tried": ["no-such-config"]})
