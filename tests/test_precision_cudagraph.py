"""The precision and cuda-graph agents and the solution wrapper they share.

Covered (CPU, the real guard on the bundled examples, one or two small workloads):
- ``wrap.py``: wrapped solutions keep the base's spec, avoid file-name clashes, refuse C++
  bases; a wrapped destination-passing Triton base (interpreted on CPU) and a wrapped
  non destination-passing PyTorch base both PASS the guard (poisoned outputs, shifted
  input addresses, re-check).
- cuda-graph wrapper source on CPU: importable, its eager path matches the reference, its
  signature logic (shape/dtype/stride/value keys, refused arguments) and its static
  buffers (contiguous, transposed, expanded, strided with gaps, offset storage).
- cuda-graph agent: nothing on CPU; on a CUDA context it wraps the reference, then the
  board's best, again only when the best changes, never a C++ base.
- precision agent: which policies it proposes where (none without float32 matmul work, no
  TF32 on CPU, board base first); a policy on the reference rebased onto an incumbent that
  reached the board before it was judged; its candidates through the real guard on ``gemm_small``
  with the conclusion asserted from the real verdict; TF32 flags reported by the guard,
  accepted by default and rejected under strict precision (the agent then stops).
- state round trips through JSON; restore rejects malformed state; claims <= 300
  characters and code-free.

Not covered here: graph capture itself (needs CUDA: the skipif test at the end runs the real
guard on a GPU when one is visible), the orchestrator.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import agent_context, incumbent_view

from kernelarc.agents.conformance import check_agent
from kernelarc.agents.memory import code_marker
from kernelarc.agents.types import (
    CLAIM_MAX,
    BoardSnapshot,
    CandidateResult,
    Conclusion,
    IncumbentView,
    WorkloadResult,
)
from kernelarc.examples import example_dir
from kernelarc.guard.build import choose_builder, load_entry
from kernelarc.guard.evaluator import EvalResult, Guard, GuardConfig
from kernelarc.orchestration.judge import results_of, score_of
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.schema import Solution
from kernelarc.proposers.builtin import make_solution
from kernelarc.proposers.compiler import CompilerAgent
from kernelarc.proposers.cudagraph import CudaGraphAgent, graph_solution
from kernelarc.proposers.precision import (
    LEAD_PRIORITY,
    LOOSE_RTOL,
    PrecisionAgent,
    policy_named,
    policy_order,
    policy_solution,
)
from kernelarc.proposers.wrap import WrapError, why_not_wrappable, wrap_solution

NO_TRITON_DRIVER = "active drivers"  # Triton's error when it has neither a GPU nor interpreter


@pytest.fixture(scope="module")
def rms() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


@pytest.fixture(scope="module")
def gemm() -> Problem:
    return load_problem(example_dir("gemm_small"))


def _example(problem: Problem, file: str) -> Solution:
    return load_solution(problem.root / file)


def _reference(problem: Problem) -> Solution:
    d = problem.definition
    return make_solution(d, agent="t", name="ref", description="r", source=d.reference, entry="run")


def _board(*views: IncumbentView) -> BoardSnapshot:
    return BoardSnapshot(incumbents=views, version=len(views))


def _view(agent: str, cid: str, score: float, solution: Solution) -> IncumbentView:
    view: IncumbentView = incumbent_view(agent, cid, score, solution)
    return view


def _result(ev: EvalResult, agent: str, candidate_id: str = "c1") -> CandidateResult:
    per = results_of(ev.outcomes, {})
    passed = bool(per) and all(r.status == "PASSED" for r in per)
    return CandidateResult(
        candidate_id=candidate_id,
        agent=agent,
        strategy=agent,
        mode="refine",
        stage="full",
        per_workload=per,
        passed=passed,
        score=score_of(per) if passed else None,
    )


def _check_claim(c: Conclusion) -> None:
    assert 0 < len(c.claim) <= CLAIM_MAX, c.claim
    assert code_marker(c.claim) is None, c.claim


def _statuses(ev: EvalResult) -> list[tuple[str, str | None, str]]:
    return [(o.status.value, o.check, o.log[:600]) for o in ev.outcomes]


# ------------------------------------------------------------------------------ wrap.py


def test_wrap_keeps_spec_and_avoids_name_clashes(rms: Problem) -> None:
    triton_base = _example(rms, "solution_triton.json")
    clash = triton_base.model_copy(
        update={
            "sources": [
                *triton_base.sources,
                triton_base.sources[0].model_copy(update={"path": "kernelarc_cudagraph.py"}),
            ]
        }
    )
    wrapped = graph_solution(clash, rms.definition, name="w", what="a base")
    assert wrapped.spec.entry_point == "kernelarc_cudagraph_1.py::kernelarc_entry"
    assert wrapped.spec.languages == triton_base.spec.languages
    assert wrapped.spec.destination_passing_style is True
    assert [s.path for s in wrapped.sources][:2] == [s.path for s in clash.sources]
    again = graph_solution(wrapped, rms.definition, name="w2", what="a wrapper")
    assert again.spec.entry_point == "kernelarc_cudagraph_2.py::kernelarc_entry"


def test_wrap_refuses_cpp_and_foreign_bases(rms: Problem, gemm: Problem) -> None:
    cuda = _example(rms, "solution_cuda.json")
    reason = why_not_wrappable(cuda)
    assert reason is not None and "C++" in reason
    with pytest.raises(WrapError, match="C\\+\\+"):
        graph_solution(cuda, rms.definition, name="w", what="cuda")
    with pytest.raises(WrapError, match="solves"):
        graph_solution(_reference(rms), gemm.definition, name="w", what="x")
    with pytest.raises(WrapError, match="must define"):
        wrap_solution(
            _reference(rms), rms.definition, agent="t", name="w", description="d",
            body="x = 1", stem="s", docstring="d",
        )  # fmt: skip


@pytest.fixture(scope="module")
def rms_guard(rms: Problem, tmp_path_factory: pytest.TempPathFactory):
    config = GuardConfig(
        device="cpu", rounds=2, warmup=1, iterations=3, timeout=300,
        cache_dir=tmp_path_factory.mktemp("guard-cache"),
    )  # fmt: skip
    with Guard(rms, config) as g:
        yield g


def _smallest(problem: Problem, n: int) -> list[Any]:
    axis = next(name for name, a in problem.definition.axes.items() if a.type == "var")
    return sorted(problem.workloads, key=lambda w: w.axes[axis])[:n]


@pytest.mark.parametrize("file", ["solution_triton.json", "solution_pytorch.json"])
def test_wrapped_bases_pass_the_guard(rms: Problem, rms_guard: Guard, file: str) -> None:
    base = _example(rms, file)
    if file == "solution_triton.json":
        pytest.importorskip("triton")
    wrapped = graph_solution(base, rms.definition, name=f"graph-{file}", what=file)
    assert wrapped.spec.destination_passing_style is base.spec.destination_passing_style
    ev = rms_guard.evaluate(wrapped, _smallest(rms, 1))
    if any(NO_TRITON_DRIVER in o.log for o in ev.outcomes):
        pytest.skip(f"Triton does not run interpreted here: {ev.outcomes[0].log[:300]}")
    assert all(s[0] == "PASSED" for s in _statuses(ev)), _statuses(ev)


def test_wrapped_non_dps_reference_passes_the_guard(rms: Problem, rms_guard: Guard) -> None:
    wrapped = graph_solution(_reference(rms), rms.definition, name="graph-ref", what="ref")
    assert wrapped.spec.destination_passing_style is False
    ev = rms_guard.evaluate(wrapped, _smallest(rms, 2))
    assert len(ev.outcomes) == 2 and all(s[0] == "PASSED" for s in _statuses(ev)), _statuses(ev)


# ------------------------------------------------------------------------------ graph source


@pytest.fixture(scope="module")
def graph_module(rms: Problem, tmp_path_factory: pytest.TempPathFactory) -> Any:
    sol = graph_solution(_reference(rms), rms.definition, name="g", what="the reference")
    tmp = tmp_path_factory.mktemp("graph-module")
    art = choose_builder(sol).build(sol, work_dir=tmp / "w", cache_dir=tmp / "c", timeout=60)
    load_entry(art)
    return sys.modules[art.module_name]


def test_graph_wrapper_cpu_path_matches_reference(rms: Problem, graph_module: Any) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    w = torch.randn(512, generator=gen).to(torch.bfloat16)
    namespace: dict[str, Any] = {}
    exec(compile(rms.definition.reference, "reference", "exec"), namespace)
    want = namespace["run"](x, w)
    got = graph_module.kernelarc_entry(x, w)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert graph_module._ka_graphs == {}, "no graph is captured for CPU tensors"


def test_graph_signature_logic(graph_module: Any) -> None:
    sig = graph_module.signature
    a = torch.zeros(4, 8)
    assert sig((a, 1.0)) == sig((torch.ones(4, 8), 1.0)), "values of tensors are not keys"
    different = [
        (torch.zeros(5, 8), 1.0),
        (torch.zeros(4, 8, dtype=torch.float16), 1.0),
        (torch.zeros(8, 4).t(), 1.0),
        (a, 2.0),
        (a, 1),
        (a, None),
    ]
    keys = {sig(args) for args in different}
    assert len(keys) == len(different) and sig((a, 1.0)) not in keys
    with pytest.raises(TypeError, match="argument 0 is a list holding a Tensor"):
        sig(([a],))
    with pytest.raises(TypeError, match="argument 1 is a object"):
        sig((a, object()))
    with pytest.raises(TypeError, match="argument 1"):
        graph_module.kernelarc_entry(a, object())


@pytest.mark.parametrize(
    "make",
    [
        lambda v: (torch.arange(12.0) + v).view(3, 4),
        lambda v: (torch.arange(12.0) + v).view(3, 4).t(),
        lambda v: (torch.arange(4.0) + v).expand(3, 4),
        lambda v: (torch.arange(4.0) + v).view(4, 1).expand(4, 3),
        lambda v: (torch.arange(40.0) + v).view(5, 8)[:, 1:4],
        lambda v: (torch.arange(20.0) + v)[7:19].view(3, 4),
        lambda v: torch.tensor(2.5 + v),
        lambda v: torch.empty(0, 4),
    ],
    ids=["contiguous", "transposed", "expanded", "expanded-col", "gaps", "offset", "0d", "empty"],
)
def test_graph_static_buffers_keep_layout(graph_module: Any, make: Any) -> None:
    """The signature fixes shape and strides; a buffer must take any tensor of that layout."""
    t = make(0.0)
    buf = graph_module._KaBuffer(t)
    assert buf.tensor.shape == t.shape and buf.tensor.stride() == t.stride()
    for v in (0.0, 100.0):
        fresh = make(v)
        assert fresh.stride() == t.stride()
        buf.fill_from(fresh)
        assert torch.equal(buf.tensor, fresh)


# ------------------------------------------------------------------------------ cuda-graph agent


def test_cudagraph_agent_proposes_nothing_on_cpu(rms: Problem) -> None:
    agent = CudaGraphAgent()
    assert agent.propose(agent_context(rms)) is None
    assert "CUDA only" in CudaGraphAgent.description


def test_cudagraph_agent_wraps_best_once_per_change(rms: Problem) -> None:
    agent = CudaGraphAgent()
    first = agent.propose(agent_context(rms, device="cuda"))
    assert first is not None and first.parent_id is None and "reference" in first.tags
    assert agent.propose(agent_context(rms, device="cuda")) is None, "the reference is wrapped once"
    triton_base, cuda = _example(rms, "solution_triton.json"), _example(rms, "solution_cuda.json")
    board = _board(
        _view("tuner", "t1", 2.0, triton_base),
        _view("coder", "k1", 5.0, cuda),  # best, but C++: cannot be wrapped
        _view(agent.name, "own", 9.0, first.solution),  # its own: never wrapped again
    )
    second = agent.propose(agent_context(rms, device="cuda", board=board))
    assert second is not None and second.parent_id == "t1"
    assert second.solution.spec.destination_passing_style is True
    assert agent.propose(agent_context(rms, device="cuda", board=board)) is None
    newer = _board(*board.incumbents, _view("compiler", "c9", 3.0, _reference(rms)))
    third = agent.propose(agent_context(rms, device="cuda", board=newer))
    assert third is not None and third.parent_id == "c9"


def test_cudagraph_agent_rebases_a_wrap_made_before_the_board_changed(rms: Problem) -> None:
    """Asked on an empty board it wraps the reference; when a wrappable incumbent appears
    before that wrap is judged, ``rebase`` wraps the incumbent instead, and the reference can
    be wrapped later; a wrap of the board's current best, a draft and the CPU stay as they are."""
    agent = CudaGraphAgent()
    first = agent.propose(agent_context(rms, device="cuda"))
    assert first is not None and first.parent_id is None
    assert agent.rebase(first, agent_context(rms, device="cuda")) is None, "nothing new"
    board = _board(_view("tuner", "t1", 2.0, _example(rms, "solution_triton.json")))
    assert agent.rebase(first, agent_context(rms, board=board)) is None, "the CPU: no graphs"
    moved = agent.rebase(first, agent_context(rms, device="cuda", board=board))
    assert moved is not None and moved.parent_id == "t1" and "board" in moved.tags
    assert agent.state()["wrapped"] == ["t1"] and agent.state()["count"] == 1
    assert agent.rebase(moved, agent_context(rms, device="cuda", board=board)) is None
    draft = moved.model_copy(update={"mode": "draft"})
    newer = _board(*board.incumbents, _view("compiler", "c9", 3.0, _reference(rms)))
    assert agent.rebase(draft, agent_context(rms, device="cuda", board=newer)) is None
    again = agent.propose(agent_context(rms, device="cuda"))
    assert again is not None and again.parent_id is None, "the reference is wrapped later"


def test_cudagraph_agent_concludes_and_round_trips(rms: Problem, rms_guard: Guard) -> None:
    agent = CudaGraphAgent()
    proposal = agent.propose(agent_context(rms, device="cuda"))
    assert proposal is not None
    state = json.loads(json.dumps(agent.state()))
    twin = CudaGraphAgent()
    twin.restore(state)
    assert twin.state() == agent.state()
    # Judged on the CPU: the wrapper's eager path (no capture), but a real verdict.
    ev = rms_guard.evaluate(proposal.solution, _smallest(rms, 1))
    conclusion = twin.observe(_result(ev, agent.name))
    _check_claim(conclusion)
    assert conclusion.claim.startswith("CUDA graph of the reference: passed 1/1 workloads")
    assert conclusion.outcome in ("no_gain", "regressed")
    bad_states: list[dict[str, object]] = [
        {"wrapped": "t1"},
        {"count": -1},
        {"pending": {"base": "x"}},
        {"pending": {"base": "x", "label": "y", "baseline_ms": {"u": [1]}}},
        {"classes": []},
    ]
    for bad in bad_states:
        with pytest.raises(ValueError, match="cuda-graph agent state"):
            CudaGraphAgent().restore(bad)


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
    triton_rms = _example(rms, "solution_triton.json")
    assert [] == _proposals(PrecisionAgent(), rms, board=_board(_view("t", "x", 2, triton_rms)))
    board = _board(_view("compiler", "c7", 1.5, _example(gemm, "solution_pytorch.json")))
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
    ref_on_board = _board(_view("reference", "r1", 1.0, _reference(gemm)))
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
    board = _board(_view("rewrite", "g1", 1.4, _example(gemm, "solution_pytorch.json")))
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
    workloads = _smallest(gemm, 2)
    seen: list[tuple[str, bool]] = []
    while (proposal := agent.propose(agent_context(gemm))) is not None:
        policy = policy_named(proposal.tags[1])
        ev = lax.evaluate(proposal.solution, workloads)
        statuses = _statuses(ev)
        assert all(s[0] in ("PASSED", "INCORRECT_NUMERICAL") for s in statuses), statuses
        result = _result(ev, agent.name, f"c{len(seen)}")
        conclusion = agent.observe(result)
        _check_claim(conclusion)
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
        _reference(gemm), gemm.definition, policy_named("tf32"), name="tf32", what="the reference"
    )
    workloads = _smallest(gemm, 1)
    ev = lax.evaluate(tf32, workloads)
    assert all(s[0] == "PASSED" for s in _statuses(ev)), _statuses(ev)
    assert "'cuda.matmul.allow_tf32': True" in (ev.traces[0].evaluation.log or "")
    agent = PrecisionAgent()
    proposal = agent.propose(agent_context(gemm, device="cuda"))
    assert proposal is not None and proposal.tags[1] == "tf32"
    assert proposal.solution.content_hash() == tf32.content_hash()
    rejected = strict.evaluate(proposal.solution, workloads)
    assert [(s[0], s[1]) for s in _statuses(rejected)] == [("REWARD_HACK", "precision")]
    conclusion = agent.observe(_result(rejected, agent.name))
    _check_claim(conclusion)
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


# ------------------------------------------------------------------------------ CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("file", ["solution_triton.json", "solution_pytorch.json", None])
def test_graphs_pass_the_guard_on_cuda(rms: Problem, file: str | None, tmp_path: Path) -> None:
    base = _example(rms, file) if file else _reference(rms)
    if file == "solution_triton.json":
        pytest.importorskip("triton")
    wrapped = graph_solution(base, rms.definition, name=f"graph-{file}", what=str(file))
    config = GuardConfig(device="cuda", rounds=3, warmup=3, iterations=10, cache_dir=tmp_path)
    with Guard(rms, config) as guard:
        ev = guard.evaluate(wrapped, _smallest(rms, 2))
    assert all(s[0] == "PASSED" for s in _statuses(ev)), _statuses(ev)


# ------------------------------------------------------------------------------ conformance


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_agents_pass_the_conformance_checks(gemm: Problem, device: str) -> None:
    """The shipped checks; a "cuda" context only builds proposals, nothing runs on a GPU."""
    check_agent(PrecisionAgent, gemm, device)
    check_agent(CudaGraphAgent, gemm, device)
