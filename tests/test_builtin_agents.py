"""The built-in proposers (reference, compiler), the scripted test agent and the registry.

Covered: proposals validate as ``Solution`` and build with the real builder; the reference
agent's candidate passes the real guard on the CPU (bundled ``rmsnorm_h512`` example, two
small workloads); a ``torch.compile`` candidate passes the real guard (no false alarm from
Inductor's own subprocesses, environment keys or caches); conclusions from real and
constructed verdicts (claim, effect by workload class, outcome); drafting; state round
trips through JSON; the scripted agent's recording; the registry's names and errors.

Not covered: CUDA (``reduce-overhead`` is only proposed, never run here), the orchestrator.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _shared import agent_context, incumbent_view

from kernelarc.agents.types import (
    AgentContext,
    BoardSnapshot,
    CandidateResult,
    IncumbentView,
    Proposal,
    WorkloadResult,
)
from kernelarc.errors import KernelArcError
from kernelarc.examples import example_dir
from kernelarc.guard.build import choose_builder, load_entry
from kernelarc.guard.evaluator import EvalResult, Guard, GuardConfig
from kernelarc.orchestration.judge import results_of, score_of
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.builtin import ReferenceAgent
from kernelarc.proposers.compiler import (
    BASELINE,
    COMPILE_VARIANTS,
    CompilerAgent,
    compiled_source,
)
from kernelarc.proposers.registry import available_agents, describe, make_agents
from kernelarc.proposers.scripted import ScriptedAgent


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


def _result(ev: EvalResult, agent: str, candidate_id: str = "c1") -> CandidateResult:
    """The guard's verdict as agents see it (what the orchestrator's judge hands them)."""
    per = results_of(ev.outcomes, {})
    passed = bool(per) and all(r.status == "PASSED" for r in per)
    score = score_of(per) if passed else None
    return CandidateResult(
        candidate_id=candidate_id,
        agent=agent,
        strategy=agent,
        mode="refine",
        stage="full",
        per_workload=per,
        passed=passed,
        score=score,
    )


def _wr(uuid: str, batch: int, latency: float | None, ref: float, status: str = "PASSED"):
    return WorkloadResult(
        uuid=uuid, axes={"batch_size": batch}, status=status, latency_ms=latency, reference_ms=ref
    )


def _all_proposals(agent, problem: Problem, device: str = "cpu") -> list[Proposal]:
    out = []
    while (p := agent.propose(agent_context(problem, device=device))) is not None:
        out.append(p)
        assert len(out) <= len(COMPILE_VARIANTS) + 1, "the agent never stops proposing"
    return out


# ------------------------------------------------------------------------------ proposals


def test_proposals_validate_and_build(problem: Problem, tmp_path: Path) -> None:
    proposals = _all_proposals(ReferenceAgent(), problem) + _all_proposals(CompilerAgent(), problem)
    assert len(proposals) == 1 + sum(not v.cuda_only for v in COMPILE_VARIANTS)
    names = [p.solution.name for p in proposals]
    assert len(set(names)) == len(names), names
    for p in proposals:
        sol = Solution.model_validate(p.solution.model_dump(mode="json"))
        assert sol.definition == problem.definition.name
        assert sol.author in ("kernelarc:reference", "kernelarc:compiler")
        assert [lang.value for lang in sol.spec.languages] == ["pytorch"]
        assert sol.spec.destination_passing_style is False
        art = choose_builder(sol).build(
            sol, work_dir=tmp_path / "work", cache_dir=tmp_path / "cache", timeout=60
        )
        assert art.module_path.is_file() and art.symbol == sol.spec.entry_symbol
    reference = proposals[0].solution
    assert reference.sources[0].content == problem.definition.reference
    assert reference.spec.entry_point == "solution.py::run"
    assert all(p.solution.spec.entry_point == "solution.py::kernelarc_entry" for p in proposals[1:])


def test_cuda_device_adds_reduce_overhead(problem: Problem) -> None:
    cpu = {p.tags[1] for p in _all_proposals(CompilerAgent(), problem, "cpu")}
    cuda = {p.tags[1] for p in _all_proposals(CompilerAgent(), problem, "cuda:0")}
    assert "reduce-overhead" not in cpu and cuda - cpu == {"reduce-overhead"}


def test_compiled_candidate_matches_reference_in_process(
    problem: Problem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generated module imports and computes what the reference computes. (Inductor
    writes its cache location into the environment: kept to this test.)"""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.delenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", raising=False)
    sol = CompilerAgent().propose(agent_context(problem))
    assert sol is not None
    art = choose_builder(sol.solution).build(
        sol.solution, work_dir=tmp_path / "w", cache_dir=tmp_path / "c", timeout=60
    )
    entry = load_entry(art)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    w = torch.randn(512, generator=gen).to(torch.bfloat16)
    namespace: dict[str, object] = {}
    exec(compile(problem.definition.reference, "reference", "exec"), namespace)
    want = namespace["run"](x, w)  # type: ignore[operator]
    got = entry(x, w)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------ real guard


@pytest.fixture(scope="module")
def guard(problem: Problem, tmp_path_factory: pytest.TempPathFactory):
    config = GuardConfig(
        device="cpu",
        warmup=1,
        iterations=3,
        timeout=300,
        cache_dir=tmp_path_factory.mktemp("guard-cache"),
    )
    with Guard(problem, config) as g:
        yield g


def _small(problem: Problem):
    return [w for w in problem.workloads if w.axes["batch_size"] <= 3][:2]


def test_reference_candidate_passes_the_guard(problem: Problem, guard: Guard) -> None:
    agent = ReferenceAgent()
    proposal = agent.propose(agent_context(problem))
    assert proposal is not None
    assert agent.propose(agent_context(problem)) is None, "the reference is proposed only once"
    ev = guard.evaluate(proposal.solution, _small(problem))
    statuses = [(o.status.value, o.check, o.log[:300]) for o in ev.outcomes]
    assert len(statuses) == 2 and all(s[0] == "PASSED" for s in statuses), statuses
    result = _result(ev, agent.name)
    conclusion = agent.observe(result)
    assert conclusion.outcome == "no_gain"
    assert "baseline" in conclusion.claim and f"{result.score:.2f}x" in conclusion.claim
    assert set(conclusion.effect) <= {"small: batch_size<=16", "large: batch_size>16"}


@pytest.fixture(scope="module")
def compiled_verdict(problem: Problem, guard: Guard) -> tuple[CompilerAgent, EvalResult]:
    agent = CompilerAgent()
    proposal = agent.propose(agent_context(problem))
    assert proposal is not None and proposal.tags == ("compiler", "static")
    return agent, guard.evaluate(proposal.solution, _small(problem))


def test_compiled_candidate_passes_the_guard(compiled_verdict) -> None:
    _, ev = compiled_verdict
    statuses = [(o.status.value, o.check, o.log[:300]) for o in ev.outcomes]
    assert all(s[0] == "PASSED" for s in statuses), statuses


def test_compiler_concludes_from_the_real_verdict(compiled_verdict) -> None:
    agent, ev = compiled_verdict
    result = _result(ev, agent.name)
    conclusion = agent.observe(result)
    assert conclusion.tags == ("compiler", "static")
    assert conclusion.claim.startswith("torch.compile dynamic=False fullgraph=False:")
    assert "_compiled" not in conclusion.claim and "def " not in conclusion.claim
    if result.passed:
        assert conclusion.outcome in ("no_gain", "regressed") and "over eager" in conclusion.claim
    else:
        first = next(o for o in ev.outcomes if o.status.value != "PASSED")
        assert conclusion.outcome == "failed" and first.status.value in conclusion.claim


# ------------------------------------------------------------------------------ board bases


def _board_views(problem: Problem) -> tuple[IncumbentView, ...]:
    """A precision wrapper (2.0x), a CUDA-graph wrapper (3.0x) and the plain reference
    (5.0x) of other agents, as the board shows them."""
    from kernelarc.proposers.cudagraph import graph_solution
    from kernelarc.proposers.precision import policy_named, policy_solution

    d = problem.definition
    ref = ReferenceAgent().propose(agent_context(problem))
    assert ref is not None
    tf32 = policy_solution(ref.solution, d, policy_named("tf32"), name="p-tf32", what="ref")
    graph = graph_solution(ref.solution, d, name="g", what="ref")

    return (
        incumbent_view("precision", "c3", 2.0, tf32),
        incumbent_view("cuda-graph", "c5", 3.0, graph),
        incumbent_view("reference", "c1", 5.0, ref.solution),
    )


def test_compiler_compiles_a_better_board_incumbent_once(problem: Problem, guard: Guard) -> None:
    """The best other incumbent worth compiling (not a CUDA graph, not the bare reference,
    better than eager and than the compiler's own) is compiled before the next variant, once;
    the wrapped candidate passes the guard and the conclusion names its base."""
    board = BoardSnapshot(incumbents=_board_views(problem), version=3)
    agent = _after_plain(problem, board=board, incumbent=None)
    first = agent.propose(agent_context(problem, board=board, incumbent=None))
    assert first is not None and first.tags == ("compiler", "default", "board"), first.tags
    assert first.parent_id == "c3" and first.mode == "refine"
    entry = first.solution.sources[-1].content
    assert "_ka_compiled = torch.compile(_ka_base)" in entry
    assert first.solution.compiles_at_run_time()
    assert len(first.solution.sources) == 3, "the base's files and the compiling wrapper"
    again = agent.propose(agent_context(problem, board=board, incumbent=None))
    assert again is not None and again.tags == ("compiler", MAX_AUTOTUNE), "no base twice"
    ev = guard.evaluate(first.solution, _small(problem))
    statuses = [(o.status.value, o.log[:300]) for o in ev.outcomes]
    assert all(st == "PASSED" for st, _ in statuses), statuses
    twin = CompilerAgent()
    twin.restore(json.loads(json.dumps(agent.state())))
    assert twin.propose(agent_context(problem, board=board, incumbent=None)).tags[-1] != "board"
    # Observed in order: the board candidate's conclusion names its base.
    fresh = _after_plain(problem, board=board, incumbent=None)
    fresh.propose(agent_context(problem, board=board, incumbent=None))
    conclusion = fresh.observe(_result(ev, fresh.name))
    assert conclusion.claim.startswith("torch.compile default settings of c3:"), conclusion.claim


def test_compiler_compares_bases_with_bases(problem: Problem) -> None:
    """A board base qualifies when it is better, uncompiled, than the base of the compiler's
    best compile: a compiled reference at 9x does not block a 2x policy (the reference is
    1x). Once that base's compile won, a weaker base is left (the walk goes on) and a
    stronger one is compiled."""
    views = _board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    tf32 = views[0].solution
    won = [_wr("w1", 1, 0.5, 1.0)]
    mine = views[0].model_copy(update={"agent": "compiler", "candidate_id": "c9", "score": 9.0})
    board = BoardSnapshot(incumbents=views, version=3)
    agent = _after_plain(problem, board=board, incumbent=mine)
    first = agent.propose(agent_context(problem, board=board, incumbent=mine))
    assert first is not None and first.parent_id == "c3" and first.tags[-1] == "board"
    agent.observe(_synthetic(won, improved=True))
    mine = mine.model_copy(update={"candidate_id": "c10", "score": 12.0})
    weaker = incumbent_view("rewrite", "c4", 1.5, tf32.model_copy(update={"name": "w"}))
    board = BoardSnapshot(incumbents=(*views, weaker), version=4)
    walk = agent.propose(agent_context(problem, board=board, incumbent=mine))
    assert walk is not None and walk.tags == ("compiler", "static", "board")
    assert walk.parent_id == "c3", "the walk on the winning base, not the weaker base"
    agent.observe(_synthetic(won))
    stronger = incumbent_view("rewrite", "c6", 2.5, tf32.model_copy(update={"name": "s"}))
    board = BoardSnapshot(incumbents=(*views, stronger), version=5)
    nxt = agent.propose(agent_context(problem, board=board, incumbent=mine))
    assert nxt is not None and nxt.parent_id == "c6"
    assert nxt.tags == ("compiler", "default", "board")
    with pytest.raises(ValueError, match="'bases'"):
        CompilerAgent().restore({"bases": "c3"})


def test_compiler_compiles_a_former_incumbent_the_current_one_hides(problem: Problem) -> None:
    """When an agent's new incumbent cannot be compiled (a policy around a CUDA graph), its
    former one (the policy around the reference) is still a base: L1 017, H200, session 14,
    where the compiler compiled a weaker rewritten graph instead."""
    from kernelarc.proposers.precision import policy_named, policy_solution

    views = _board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    graph = views[1].solution
    around = policy_solution(graph, problem.definition, policy_named("tf32"), name="pg", what="g")
    on_graph = incumbent_view("precision", "c8", 3.5, around)
    weaker = incumbent_view(
        "rewrite", "c4", 1.5, views[0].solution.model_copy(update={"name": "w"})
    )
    board = BoardSnapshot(incumbents=(on_graph, views[1], weaker), version=4, former=(views[0],))
    agent = _after_plain(problem, board=board, incumbent=None)
    proposal = agent.propose(agent_context(problem, board=board, incumbent=None))
    assert proposal is not None and proposal.parent_id == "c3", proposal
    assert proposal.tags == ("compiler", "default", "board")
    without = BoardSnapshot(incumbents=board.incumbents, version=4)
    other = _after_plain(problem, board=without, incumbent=None)
    fallback = other.propose(agent_context(problem, board=without, incumbent=None))
    assert fallback is not None and fallback.parent_id == "c4", "only the current: rewrite's"


def test_compiler_rebases_a_stale_proposal_onto_a_better_board_incumbent(
    problem: Problem,
) -> None:
    """The reference's default compile (torch.compile's baseline) is never rebased. The next
    configuration, proposed on an empty board, is: once a better incumbent is on the board,
    ``rebase`` compiles that instead and the configuration comes back later; a board proposal
    moves to a still better base only; drafts stay."""
    views = _board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    agent = CompilerAgent()
    empty = agent_context(problem, board=BoardSnapshot(version=0), incumbent=None)
    board = BoardSnapshot(incumbents=views[:1], version=1)
    plain = agent.propose(empty)
    assert plain is not None and plain.tags == ("compiler", "static") and plain.parent_id is None
    assert agent.rebase(plain, agent_context(problem, board=board, incumbent=None)) is None
    agent.observe(_synthetic([_wr("w1", 1, 0.9, 1.0)]))
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
    views = _board_views(problem)  # precision 2.0 (c3), cuda-graph 3.0, reference 5.0
    board = BoardSnapshot(incumbents=views[:1], version=1)
    won = [_wr("w1", 1, 0.5, 1.0)]

    loser = _after_plain(problem, board=board, incumbent=None)
    assert loser.propose(agent_context(problem, board=board, incumbent=None)).parent_id == "c3"
    loser.observe(_synthetic(won, improved=False))
    nxt = loser.propose(agent_context(problem, board=board, incumbent=None))
    assert nxt is not None and nxt.tags == ("compiler", MAX_AUTOTUNE) and nxt.parent_id is None

    agent = _after_plain(problem, board=board, incumbent=None)
    first = agent.propose(agent_context(problem, board=board, incumbent=None))
    assert first is not None and first.tags == ("compiler", "default", "board")
    agent.observe(_synthetic(won, improved=True))
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
    twin.observe(_synthetic(won, improved=False))
    back = twin.propose(agent_context(problem, board=board2, incumbent=mine))
    assert back is not None and back.tags == ("compiler", "static", "board"), "put back"
    assert back.parent_id == "c3"

    agent.observe(_synthetic(won, improved=False))
    draft = agent.propose(agent_context(problem, board=board, incumbent=mine, must_draft=True))
    assert draft is not None and draft.mode == "draft" and draft.tags[-1] != "board"
    with pytest.raises(ValueError, match="'on'"):
        CompilerAgent().restore({"on": {"agent": 1}})


# ------------------------------------------------------------------------------ conclusions


MAX_AUTOTUNE = "max-autotune-no-cudagraphs"
"""The reference's configuration after the baseline's (static) in the compiler's walk."""


def _after_plain(problem: Problem, **ctx: object) -> CompilerAgent:
    """A compiler agent whose first proposal, the reference's default compile (never
    displaced by a board base), was judged: not an improvement."""
    agent = CompilerAgent()
    plain = agent.propose(agent_context(problem, **ctx))
    assert plain is not None and plain.tags == ("compiler", "static") and plain.mode == "refine"
    assert "torch.compile(run, dynamic=False, fullgraph=False)" in plain.solution.sources[0].content
    agent.observe(_synthetic([_wr("w1", 1, 0.9, 1.0)]))
    return agent


def _compiler_after_one_proposal(problem: Problem, **ctx: object) -> CompilerAgent:
    agent = CompilerAgent()
    assert agent.propose(agent_context(problem, **ctx)) is not None
    return agent


def _synthetic(per, *, improved: bool = False) -> CandidateResult:
    passed = all(r.status == "PASSED" for r in per)
    score = score_of(per) if passed else None
    return CandidateResult(
        candidate_id="c7",
        agent="compiler",
        strategy="compiler",
        mode="refine",
        stage="full",
        per_workload=tuple(per),
        passed=passed,
        score=score,
        improved=improved,
    )


def test_compiler_conclusion_effect_by_class(problem: Problem) -> None:
    agent = _compiler_after_one_proposal(problem)
    per = [_wr("a", 1, 1.0, 1.0), _wr("b", 16, 1.0, 2.0), _wr("c", 128, 1.0, 4.0)]
    conclusion = agent.observe(_synthetic(per, improved=True))
    # median_low of batch sizes 1, 3, 16, 64, 128, 257 is 16.
    assert conclusion.effect == {
        "large: batch_size>16": pytest.approx(4.0, rel=1e-3),
        "small: batch_size<=16": pytest.approx(math.sqrt(2.0), rel=1e-3),
    }
    assert conclusion.outcome == "improved" and len(conclusion.claim) <= 300
    assert "2.00x over eager on 3/3 workloads" in conclusion.claim
    assert "best on large: batch_size>16" in conclusion.claim


def test_compiler_outcomes(problem: Problem) -> None:
    slow = [_wr("a", 1, 2.0, 1.0), _wr("b", 128, 2.0, 1.0)]
    assert _compiler_after_one_proposal(problem).observe(_synthetic(slow)).outcome == "regressed"
    even = [_wr("a", 1, 1.0, 1.0), _wr("b", 128, 1.0, 1.0)]
    assert _compiler_after_one_proposal(problem).observe(_synthetic(even)).outcome == "no_gain"
    bad = [_wr("a", 1, None, 1.0, status="RUNTIME_ERROR"), _wr("b", 128, 1.0, 1.0)]
    c = _compiler_after_one_proposal(problem).observe(_synthetic(bad))
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
    per = [_wr("a", 1, 1.0, 1.0), _wr("b", 128, 1.0, 1.0)]
    conclusion = agent.observe(_synthetic(per))
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
    rest = [p.tags[1] for p in _all_proposals(agent, problem)]
    assert rest == ["max-autotune-no-cudagraphs"]


def test_static_variant_compiles_every_shape(tmp_path: Path) -> None:
    """The shape-specialised configuration compiles one graph for each of 10 shapes; with
    Dynamo's default limit (8) the 9th and 10th ran eagerly (FIB 002 on the H200: 0.25x).
    In a subprocess: the solution raises process-wide Dynamo limits."""
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
    from kernelarc.proposers.compile_board import compiled_base_solution

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
    board = BoardSnapshot(incumbents=_board_views(problem), version=3)
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
    agent.observe(_synthetic([_wr("w1", 1, 0.9, 1.0)]))
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


def test_reference_state_round_trip(problem: Problem) -> None:
    agent = ReferenceAgent()
    agent.propose(agent_context(problem))
    twin = ReferenceAgent()
    twin.restore(json.loads(json.dumps(agent.state())))
    assert twin.propose(agent_context(problem)) is None
    with pytest.raises(ValueError, match="proposed"):
        twin.restore({"proposed": "yes"})


# ------------------------------------------------------------------------------ scripted


def test_scripted_agent_records_and_replays(problem: Problem) -> None:
    ref = ReferenceAgent().propose(agent_context(problem))
    assert ref is not None

    def custom(ctx: AgentContext) -> Proposal:
        return Proposal(solution=ref.solution, hypothesis=f"round {ctx.round}", mode="draft")

    agent = ScriptedAgent([ref.solution, custom, None, ref.solution], name="fake")
    contexts = [agent_context(problem, round=i, must_draft=(i == 0)) for i in range(4)]
    p0 = agent.propose(contexts[0])
    assert p0 is not None and p0.mode == "draft" and p0.solution == ref.solution
    c0 = agent.observe(_synthetic([_wr("a", 1, 1.0, 2.0)]))
    assert c0.claim == "scripted step 0: passed=True score=2.000" and c0.agent == "fake"
    saved = json.loads(json.dumps(agent.state()))
    p1 = agent.propose(contexts[1])
    assert p1 is not None and p1.hypothesis == "round 1"
    c1 = agent.observe(_synthetic([_wr("a", 1, None, 2.0, status="TIMEOUT")]))
    assert c1.claim == "scripted step 1: passed=False score=None" and c1.outcome == "failed"
    assert agent.propose(contexts[2]) is None and agent.propose(contexts[3]) is None
    assert agent.contexts == contexts and [r.candidate_id for r in agent.results] == ["c7"] * 2

    twin = ScriptedAgent([ref.solution, custom, None, ref.solution], name="fake")
    twin.restore(saved)
    again = twin.propose(contexts[1])
    assert again is not None and again.hypothesis == "round 1"
    with pytest.raises(ValueError, match="not within"):
        twin.restore({"index": 9})


def test_scripted_step_must_return_a_proposal(problem: Problem) -> None:
    agent = ScriptedAgent([lambda ctx: "not a proposal"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must return a Proposal"):
        agent.propose(agent_context(problem))


# ------------------------------------------------------------------------------ registry


def test_registry() -> None:
    from kernelarc.proposers.registry import DEFAULT_AGENTS

    expected = {
        "reference",
        "compiler",
        "rewrite",
        "precision",
        "cuda-graph",
        "gemm-tables",
        "fp8-gemm",
        "tuner",
    }
    assert set(available_agents()) == expected and set(DEFAULT_AGENTS) == expected
    agents = make_agents(["compiler", "reference"])
    assert [type(a) for a in agents] == [CompilerAgent, ReferenceAgent]
    assert [a.name for a in agents] == ["compiler", "reference"]
    assert make_agents(["reference"])[0] is not make_agents(["reference"])[0]
    with pytest.raises(KernelArcError, match="agents: compiler, cuda-graph, fp8-gemm, gemm-"):
        make_agents(["reference", "gpt"])
    with pytest.raises(KernelArcError, match="given twice"):
        make_agents(["compiler", "compiler"])
    described = dict(describe())
    assert set(described) == expected
    assert all(text and "\n" not in text for text in described.values())


def test_reference_stopped_as_hopeless_is_not_called_broken(problem: Problem) -> None:
    agent = ReferenceAgent()
    assert agent.propose(agent_context(problem)) is not None
    result = CandidateResult(
        candidate_id="c3",
        agent="reference",
        strategy="reference",
        mode="refine",
        stage="screen",
        per_workload=(_wr("w1", 1, 0.18, 0.10),),
        passed=False,
        score=None,
        stopped_early="hopeless: 0.18 ms on the first screened workload",
    )
    claim = agent.observe(result).claim
    assert "stopped early (hopeless" in claim and "check the problem" not in claim
    failed = result.model_copy(
        update={"per_workload": (_wr("w1", 1, None, 0.10, "RUNTIME_ERROR"),), "stopped_early": None}
    )
    assert "check the problem" in agent.observe(failed).claim
