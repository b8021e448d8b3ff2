"""The cuda-graph agent and the solution wrapper it shares with the precision agent
(``tests/proposers/test_precision_agent.py``).

Covered (CPU, the real guard on the bundled examples, one or two small workloads):
- ``wrap.py``: wrapped solutions keep the base's spec, avoid file-name clashes, refuse C++
  bases; a wrapped destination-passing Triton base (interpreted on CPU) and a wrapped
  non destination-passing PyTorch base both PASS the guard (poisoned outputs, shifted
  input addresses, re-check).
- cuda-graph wrapper source on CPU: importable, its eager path matches the reference, its
  signature logic (shape/dtype/stride/value keys, refused arguments) and its static
  buffers (contiguous, transposed, expanded, strided with gaps, offset storage).
- cuda-graph agent: nothing on CPU; on a CUDA context it wraps the reference, then the
  board's best, again only when the best changes, never a C++ base; its state round trips
  through JSON; claims <= 300 characters and code-free; the shipped conformance checks.

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
from kernelarc.examples import example_dir
from kernelarc.guard.build import choose_builder, load_entry
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.proposers.cudagraph import CudaGraphAgent, graph_solution, replays_graphs
from kernelarc.proposers.wrap import WrapError, why_not_wrappable, wrap_solution

NO_TRITON_DRIVER = "active drivers"  # Triton's error when it has neither a GPU nor interpreter


@pytest.fixture(scope="module")
def rms() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


@pytest.fixture(scope="module")
def gemm() -> Problem:
    return load_problem(example_dir("gemm_small"))


# ------------------------------------------------------------------------------ wrap.py


def test_wrap_keeps_spec_and_avoids_name_clashes(rms: Problem) -> None:
    triton_base = example_solution(rms, "solution_triton.json")
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
    cuda = example_solution(rms, "solution_cuda.json")
    reason = why_not_wrappable(cuda)
    assert reason is not None and "C++" in reason
    with pytest.raises(WrapError, match="C\\+\\+"):
        graph_solution(cuda, rms.definition, name="w", what="cuda")
    with pytest.raises(WrapError, match="solves"):
        graph_solution(reference_solution_of(rms), gemm.definition, name="w", what="x")
    with pytest.raises(WrapError, match="must define"):
        wrap_solution(
            reference_solution_of(rms), rms.definition, agent="t", name="w", description="d",
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


@pytest.mark.parametrize("file", ["solution_triton.json", "solution_pytorch.json"])
def test_wrapped_bases_pass_the_guard(rms: Problem, rms_guard: Guard, file: str) -> None:
    base = example_solution(rms, file)
    if file == "solution_triton.json":
        pytest.importorskip("triton")
    wrapped = graph_solution(base, rms.definition, name=f"graph-{file}", what=file)
    assert wrapped.spec.destination_passing_style is base.spec.destination_passing_style
    ev = rms_guard.evaluate(wrapped, smallest_workloads(rms, 1))
    if any(NO_TRITON_DRIVER in o.log for o in ev.outcomes):
        pytest.skip(f"Triton does not run interpreted here: {ev.outcomes[0].log[:300]}")
    assert all(s[0] == "PASSED" for s in statuses_of(ev)), statuses_of(ev)


def test_wrapped_non_dps_reference_passes_the_guard(rms: Problem, rms_guard: Guard) -> None:
    wrapped = graph_solution(
        reference_solution_of(rms), rms.definition, name="graph-ref", what="ref"
    )
    assert wrapped.spec.destination_passing_style is False
    ev = rms_guard.evaluate(wrapped, smallest_workloads(rms, 2))
    assert len(ev.outcomes) == 2 and all(s[0] == "PASSED" for s in statuses_of(ev)), statuses_of(ev)


# ------------------------------------------------------------------------------ graph source


@pytest.fixture(scope="module")
def graph_module(rms: Problem, tmp_path_factory: pytest.TempPathFactory) -> Any:
    sol = graph_solution(reference_solution_of(rms), rms.definition, name="g", what="the reference")
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
    triton_base, cuda = (
        example_solution(rms, "solution_triton.json"),
        example_solution(rms, "solution_cuda.json"),
    )
    board = board_of(
        view_of("tuner", "t1", 2.0, triton_base),
        view_of("coder", "k1", 5.0, cuda),  # best, but C++: cannot be wrapped
        view_of(agent.name, "own", 9.0, first.solution),  # its own: never wrapped again
    )
    second = agent.propose(agent_context(rms, device="cuda", board=board))
    assert second is not None and second.parent_id == "t1"
    assert second.solution.spec.destination_passing_style is True
    assert agent.propose(agent_context(rms, device="cuda", board=board)) is None
    newer = board_of(*board.incumbents, view_of("compiler", "c9", 3.0, reference_solution_of(rms)))
    third = agent.propose(agent_context(rms, device="cuda", board=newer))
    assert third is not None and third.parent_id == "c9"


def test_cudagraph_agent_does_not_wrap_a_base_that_holds_a_graph_wrap(rms: Problem) -> None:
    """Another agent's incumbent built on a graph wrap (precision over cuda-graph) is passed
    over: its replay cannot be captured again."""
    agent = CudaGraphAgent()
    triton = example_solution(rms, "solution_triton.json")
    wrapped = graph_solution(triton, rms.definition, name="g", what="the Triton kernel")
    over = wrap_solution(
        wrapped, rms.definition, agent="precision", name="p", description="bf16 over a graph",
        body="def kernelarc_entry(*args):\n    return _ka_base(*args)\n", stem="kernelarc_p",
        docstring="precision over a graph wrap",
    )  # fmt: skip
    assert replays_graphs(wrapped) and replays_graphs(over) and not replays_graphs(triton)
    board = board_of(view_of("tuner", "t1", 2.0, triton), view_of("precision", "p1", 9.0, over))
    chosen = agent.propose(agent_context(rms, device="cuda", board=board))
    assert chosen is not None and chosen.parent_id == "t1"
    assert agent.propose(agent_context(rms, device="cuda", board=board)) is None


def test_cudagraph_agent_rebases_a_wrap_made_before_the_board_changed(rms: Problem) -> None:
    """Asked on an empty board it wraps the reference; when a wrappable incumbent appears
    before that wrap is judged, ``rebase`` wraps the incumbent instead, and the reference can
    be wrapped later; a wrap of the board's current best, a draft and the CPU stay as they are."""
    agent = CudaGraphAgent()
    first = agent.propose(agent_context(rms, device="cuda"))
    assert first is not None and first.parent_id is None
    assert agent.rebase(first, agent_context(rms, device="cuda")) is None, "nothing new"
    board = board_of(view_of("tuner", "t1", 2.0, example_solution(rms, "solution_triton.json")))
    assert agent.rebase(first, agent_context(rms, board=board)) is None, "the CPU: no graphs"
    moved = agent.rebase(first, agent_context(rms, device="cuda", board=board))
    assert moved is not None and moved.parent_id == "t1" and "board" in moved.tags
    assert agent.state()["wrapped"] == ["t1"] and agent.state()["count"] == 1
    assert agent.rebase(moved, agent_context(rms, device="cuda", board=board)) is None
    draft = moved.model_copy(update={"mode": "draft"})
    newer = board_of(*board.incumbents, view_of("compiler", "c9", 3.0, reference_solution_of(rms)))
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
    ev = rms_guard.evaluate(proposal.solution, smallest_workloads(rms, 1))
    conclusion = twin.observe(result_of(ev, agent.name))
    check_claim(conclusion)
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


# ------------------------------------------------------------------------------ CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("file", ["solution_triton.json", "solution_pytorch.json", None])
def test_graphs_pass_the_guard_on_cuda(rms: Problem, file: str | None, tmp_path: Path) -> None:
    base = example_solution(rms, file) if file else reference_solution_of(rms)
    if file == "solution_triton.json":
        pytest.importorskip("triton")
    wrapped = graph_solution(base, rms.definition, name=f"graph-{file}", what=str(file))
    config = GuardConfig(device="cuda", rounds=3, warmup=3, iterations=10, cache_dir=tmp_path)
    with Guard(rms, config) as guard:
        ev = guard.evaluate(wrapped, smallest_workloads(rms, 2))
    assert all(s[0] == "PASSED" for s in statuses_of(ev)), statuses_of(ev)


# ------------------------------------------------------------------------------ conformance


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_cudagraph_agent_passes_the_conformance_checks(gemm: Problem, device: str) -> None:
    """The shipped checks; a "cuda" context only builds proposals, nothing runs on a GPU."""
    check_agent(CudaGraphAgent, gemm, device)
