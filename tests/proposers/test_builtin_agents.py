"""The built-in proposers (reference, compiler), the scripted test agent and the registry.

Covered: proposals validate as ``Solution`` and build with the real builder; the reference
agent's candidate passes the real guard on the CPU (bundled ``rmsnorm_h512`` example, two
small workloads); a ``torch.compile`` candidate passes the real guard (no false alarm from
Inductor's own subprocesses, environment keys or caches); conclusions from real verdicts;
a board incumbent's compile judged by the guard; the reference's state round trip through
JSON; the scripted agent's recording; the registry's names and errors. The compiler's
choices, conclusions from constructed verdicts, drafting and its state are in
test_compiler_agent.py.

Not covered: CUDA (``reduce-overhead`` is only proposed, never run here), the orchestrator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _shared import agent_context
from data.compiler_agent import (
    MAX_AUTOTUNE,
    after_plain,
    all_proposals,
    board_views,
    synthetic,
    wr,
)
from data.wrapped_agents import result_of

from kernelarc.agents.base import AgentStateError
from kernelarc.agents.types import (
    AgentContext,
    BoardSnapshot,
    CandidateResult,
    Proposal,
)
from kernelarc.errors import KernelArcError
from kernelarc.examples import example_dir
from kernelarc.guard.build import choose_builder, load_entry
from kernelarc.guard.evaluator import EvalResult, Guard, GuardConfig
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.compiler import (
    COMPILE_VARIANTS,
    CompilerAgent,
)
from kernelarc.proposers.reference import ReferenceAgent
from kernelarc.proposers.registry import available_agents, describe, make_agents
from kernelarc.proposers.scripted import ScriptedAgent


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


# ------------------------------------------------------------------------------ proposals


def test_proposals_validate_and_build(problem: Problem, tmp_path: Path) -> None:
    proposals = all_proposals(ReferenceAgent(), problem) + all_proposals(CompilerAgent(), problem)
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
    cpu = {p.tags[1] for p in all_proposals(CompilerAgent(), problem, "cpu")}
    cuda = {p.tags[1] for p in all_proposals(CompilerAgent(), problem, "cuda:0")}
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
    result = result_of(ev, agent.name)
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
    result = result_of(ev, agent.name)
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


def test_compiler_compiles_a_better_board_incumbent_once(problem: Problem, guard: Guard) -> None:
    """The best other incumbent worth compiling (not a CUDA graph, not the bare reference,
    better than eager and than the compiler's own) is compiled before the next variant, once;
    the wrapped candidate passes the guard and the conclusion names its base."""
    board = BoardSnapshot(incumbents=board_views(problem), version=3)
    agent = after_plain(problem, board=board, incumbent=None)
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
    fresh = after_plain(problem, board=board, incumbent=None)
    fresh.propose(agent_context(problem, board=board, incumbent=None))
    conclusion = fresh.observe(result_of(ev, fresh.name))
    assert conclusion.claim.startswith("torch.compile default settings of c3:"), conclusion.claim


# ------------------------------------------------------------------------------ state


def test_reference_state_round_trip(problem: Problem) -> None:
    agent = ReferenceAgent()
    agent.propose(agent_context(problem))
    twin = ReferenceAgent()
    twin.restore(json.loads(json.dumps(agent.state())))
    assert twin.propose(agent_context(problem)) is None
    with pytest.raises(ValueError, match="proposed"):
        twin.restore({"proposed": "yes"})


@pytest.mark.parametrize("name", sorted(available_agents()))
def test_a_refused_saved_state_is_a_kernelarc_error(name: str) -> None:
    """A state ``restore`` refuses (here: its first field of the wrong type) raises an error
    the CLI shows as a message, naming the agent; the agent keeps its own state."""
    agent = available_agents()[name]()
    state = json.loads(json.dumps(agent.state()))
    key = next(iter(state))
    with pytest.raises(AgentStateError, match=f"{name} (agent )?state") as info:
        agent.restore({**state, key: [{"not": "this"}]})
    assert isinstance(info.value, KernelArcError) and isinstance(info.value, ValueError)
    assert agent.state() == state


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
    c0 = agent.observe(synthetic([wr("a", 1, 1.0, 2.0)]))
    assert c0.claim == "scripted step 0: passed=True score=2.000" and c0.agent == "fake"
    saved = json.loads(json.dumps(agent.state()))
    p1 = agent.propose(contexts[1])
    assert p1 is not None and p1.hypothesis == "round 1"
    c1 = agent.observe(synthetic([wr("a", 1, None, 2.0, status="TIMEOUT")]))
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
        per_workload=(wr("w1", 1, 0.18, 0.10),),
        passed=False,
        score=None,
        stopped_early="hopeless: 0.18 ms on the first screened workload",
    )
    claim = agent.observe(result).claim
    assert "stopped early (hopeless" in claim and "check the problem" not in claim
    failed = result.model_copy(
        update={
            "per_workload": (wr("w1", 1, None, 0.10, "RUNTIME_ERROR"),),
            "stopped_early": None,
        }
    )
    assert "check the problem" in agent.observe(failed).claim
