"""The precision agent: which policies it proposes where (none without float32 matmul work,
no TF32 on CPU, board base first); a policy on the reference rebased onto an incumbent
that reached the board before it was judged; its candidates through the real guard on
``gemm_small`` with the conclusion asserted from the real verdict; TF32 flags reported by
the guard, accepted by default and rejected under strict precision (the agent then stops);
restore rejects malformed state; the shipped conformance checks.

Not covered here: the orchestrator (``tests/orchestration/test_orchestrator*.py``), a GPU's
TF32 units.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _shared import agent_context
from data.wrapped_agents import (
    board_of,
    check_claim,
    example_solution,
    reference_solution_of,
    result_of,
    smallest_workloads,
    statuses_of,
    view_of,
)

from kernelarc.agents.conformance import check_agent
from kernelarc.agents.types import (
    CandidateResult,
    WorkloadResult,
)
from kernelarc.examples import example_dir
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.proposers.compiler import CompilerAgent
from kernelarc.proposers.precision import (
    LEAD_PRIORITY,
    LOOSE_RTOL,
    PrecisionAgent,
    policy_named,
    policy_order,
    policy_solution,
)


@pytest.fixture(scope="module")
def rms() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


@pytest.fixture(scope="module")
def gemm() -> Problem:
    return load_problem(example_dir("gemm_small"))


# ------------------------------------------------------------------------------ precision agent


def _proposals(agent: PrecisionAgent, problem: Problem, **kw: Any) -> list[Any]:
    out = []
    while (p := agent.propose(agent_context(problem, **kw))) is not None:
        out.append(p)
        assert len(out) <= 12, "the agent never stops proposing"
    return out


def test_precision_proposes_where_it_can_matter(rms: Problem, gemm: Problem) -> None:
    assert _proposals(PrecisionAgent(), rms) == [], "an elementwise bf16 problem: nothing"
    cpu = _proposals(PrecisionAgent(), gemm)
    assert [p.tags[1] for p in cpu] == ["bf16-matmul", "bf16-autocast"], "no TF32 on CPU"
    triton_rms = example_solution(rms, "solution_triton.json")
    assert [] == _proposals(PrecisionAgent(), rms, board=board_of(view_of("t", "x", 2, triton_rms)))
    board = board_of(
        view_of("compiler", "c7", 1.5, example_solution(gemm, "solution_pytorch.json"))
    )
    cuda = _proposals(PrecisionAgent(), gemm, device="cuda", board=board)
    order = [(p.tags[1], p.parent_id) for p in cuda]
    assert order == [
        ("tf32", "c7"),
        ("tf32", None),
        ("bf16-matmul", "c7"),
        ("bf16-matmul", None),
        ("bf16-autocast", "c7"),
        ("bf16-autocast", None),
    ]
    # The leading policy is judged before the compiler's when ready together; others by class.
    assert [p.priority for p in cuda] == [LEAD_PRIORITY] * 2 + [None] * 4
    assert LEAD_PRIORITY > CompilerAgent.priority
    ref_on_board = board_of(view_of("reference", "r1", 1.0, reference_solution_of(gemm)))
    deduped = _proposals(PrecisionAgent(), gemm, board=ref_on_board)
    assert len(deduped) == 2, "the reference on the board is not wrapped twice"


def test_precision_goes_lowest_first_where_every_tolerance_admits_bf16(gemm: Problem) -> None:
    """On CUDA, with every workload's max_rtol >= LOOSE_RTOL, bf16 autocast comes first (the
    leading priority); a tolerance miss on the reference steps up one level at a time. With
    one tight workload, or on a CPU, the order stays most precise first."""
    loose = tuple(w.tolerance.model_copy(update={"max_rtol": LOOSE_RTOL}) for w in gemm.workloads)
    tight = (loose[0].model_copy(update={"max_rtol": 1e-3}), *loose[1:])
    assert [p.name for p in policy_order("cuda:0", loose)] == [
        "bf16-autocast",
        "bf16-matmul",
        "tf32",
    ]
    assert [p.name for p in policy_order("cuda", tight)][0] == "tf32"
    assert [p.name for p in policy_order("cpu", loose)] == ["bf16-matmul", "bf16-autocast"]
    agent = PrecisionAgent()
    first = agent.propose(agent_context(gemm, device="cuda", board=None, tolerances=loose))
    assert first is not None and first.tags[1:] == ("bf16-autocast", "reference")
    assert first.priority == LEAD_PRIORITY
    missed = [
        WorkloadResult(uuid=w.uuid, axes=dict(w.axes), status="INCORRECT_NUMERICAL")
        for w in gemm.workloads
    ]
    agent.observe(
        CandidateResult(
            candidate_id="c1",
            agent=agent.name,
            strategy="precision",
            mode="refine",
            stage="screen",
            per_workload=tuple(missed),
            passed=False,
            score=None,
        )
    )
    rest = _proposals(agent, gemm, device="cuda", board=None, tolerances=loose)
    assert [p.tags[1] for p in rest] == ["bf16-matmul", "tf32"]
    assert [p.priority for p in rest] == [None, None]


def test_precision_rebases_a_reference_policy_onto_a_new_incumbent(gemm: Problem) -> None:
    """Asked on an empty board the agent proposes TF32 on the reference; when another agent's
    incumbent reaches the board before that proposal is judged, the same policy goes on the
    incumbent instead, and TF32 on the reference comes back later in the plan."""
    agent = PrecisionAgent()
    first = agent.propose(agent_context(gemm, device="cuda", board=None))
    assert first is not None and first.tags[1:] == ("tf32", "reference")
    assert agent.rebase(first, agent_context(gemm, device="cuda", board=None)) is None
    board = board_of(view_of("rewrite", "g1", 1.4, example_solution(gemm, "solution_pytorch.json")))
    moved = agent.rebase(first, agent_context(gemm, device="cuda", board=board))
    assert moved is not None and moved.parent_id == "g1" and moved.tags[1:] == ("tf32", "board")
    assert moved.priority == LEAD_PRIORITY
    assert agent.rebase(moved, agent_context(gemm, device="cuda", board=board)) is None
    restored = PrecisionAgent()
    restored.restore(json.loads(json.dumps(agent.state())))
    rest = _proposals(restored, gemm, device="cuda", board=board)
    assert [(p.tags[1], p.parent_id) for p in rest][:2] == [("tf32", None), ("bf16-matmul", "g1")]


@pytest.fixture(scope="module")
def gemm_guards(gemm: Problem, tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.mktemp("gemm-cache")
    common = {"device": "cpu", "rounds": 2, "warmup": 1, "iterations": 3, "cache_dir": cache}
    with (
        Guard(gemm, GuardConfig(**common)) as lax,
        Guard(gemm, GuardConfig(**common, strict_precision=True)) as strict,
    ):
        yield lax, strict


def test_precision_candidates_judged_and_concluded(gemm: Problem, gemm_guards: Any) -> None:
    lax, _ = gemm_guards
    agent = PrecisionAgent()
    workloads = smallest_workloads(gemm, 2)
    seen: list[tuple[str, bool]] = []
    while (proposal := agent.propose(agent_context(gemm))) is not None:
        policy = policy_named(proposal.tags[1])
        ev = lax.evaluate(proposal.solution, workloads)
        statuses = statuses_of(ev)
        assert all(s[0] in ("PASSED", "INCORRECT_NUMERICAL") for s in statuses), statuses
        result = result_of(ev, agent.name, f"c{len(seen)}")
        conclusion = agent.observe(result)
        check_claim(conclusion)
        assert conclusion.claim.startswith(f"{policy.label} on the reference")
        if result.passed:
            assert conclusion.outcome != "failed" and "tolerance passed (2/2)" in conclusion.claim
        else:
            assert conclusion.outcome == "failed" and "tolerance missed on M=" in conclusion.claim
        seen.append((policy.name, result.passed))
        state = json.loads(json.dumps(agent.state()))
        agent = PrecisionAgent()
        agent.restore(state)
    names = [n for n, _ in seen]
    assert names[0] == "bf16-matmul"
    # A tolerance failure skips the lower-precision policies on the same base.
    if not seen[0][1]:
        assert names == ["bf16-matmul"]
    else:
        assert names == ["bf16-matmul", "bf16-autocast"]


def test_tf32_reported_accepted_and_rejected_when_strict(gemm: Problem, gemm_guards: Any) -> None:
    lax, strict = gemm_guards
    tf32 = policy_solution(
        reference_solution_of(gemm),
        gemm.definition,
        policy_named("tf32"),
        name="tf32",
        what="the reference",
    )
    workloads = smallest_workloads(gemm, 1)
    ev = lax.evaluate(tf32, workloads)
    assert all(s[0] == "PASSED" for s in statuses_of(ev)), statuses_of(ev)
    assert "'cuda.matmul.allow_tf32': True" in (ev.traces[0].evaluation.log or "")
    agent = PrecisionAgent()
    proposal = agent.propose(agent_context(gemm, device="cuda"))
    assert proposal is not None and proposal.tags[1] == "tf32"
    assert proposal.solution.content_hash() == tf32.content_hash()
    rejected = strict.evaluate(proposal.solution, workloads)
    assert [(s[0], s[1]) for s in statuses_of(rejected)] == [("REWARD_HACK", "precision")]
    conclusion = agent.observe(result_of(rejected, agent.name))
    check_claim(conclusion)
    assert conclusion.outcome == "failed" and "strict mode" in conclusion.claim
    assert agent.propose(agent_context(gemm, device="cuda")) is None, "strict mode: the agent stops"


def test_precision_restore_rejects_bad_state() -> None:
    bad_states: list[dict[str, object]] = [
        {"tried": "tf32@reference"},
        {"tried": ["fp8@reference"]},
        {"floors": {"reference": "low"}},
        {"stopped": "yes"},
        {"count": -2},
        {"pending": {"policy": "tf32"}},
        {"pending": {"policy": "nope", "base": "reference", "label": "x"}},
        {"pending": {"policy": "tf32", "base": "r", "label": "x", "baseline_ms": {"u": "1"}}},
        {"classes": 3},
    ]
    for bad in bad_states:
        with pytest.raises(ValueError, match="precision agent"):
            PrecisionAgent().restore(bad)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_precision_agent_passes_the_conformance_checks(gemm: Problem, device: str) -> None:
    """The shipped checks; a "cuda" context only builds proposals, nothing runs on a GPU."""
    check_agent(PrecisionAgent, gemm, device)
