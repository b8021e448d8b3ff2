"""The rewrite agent's ``loops`` family: ``torch.where(mask[i])`` of a for-range loop
computed for every iteration with one nonzero (``proposers/rewrite/loops.py``).

Covered: bit-exact outputs of the hoisted source against the reference on a small MoE
loop (direct call, alias ``m = mask[e]``, ``torch.nonzero(..., as_tuple=True)``; experts
without tokens); the refusals (the mask written, re-bound or used otherwise in the loop,
the alias used otherwise, a loop that is not over ``range``, three-argument ``where``);
the run-time fallbacks (a one-dimensional mask, an index out of range raises as
``torch.where`` does); the agent proposing it when the fx trace fails and the grouped
candidate failed, and that candidate PASSING the real guard on the CPU.

Not covered: the speed (measurements in docs/PERFORMANCE.md), CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import agent_context, cpu_guard_verdict, module_from_source, moe_loop_problem

from kernelarc.proposers.rewrite import RewriteAgent
from kernelarc.proposers.rewrite.loops import HELPER, LoopRewriteError, hoist_wheres

MOE = """import torch
import torch.nn.functional as F


@torch.no_grad()
def run(x, router, w):
    weights, topk = torch.topk(router.softmax(dim=-1), 2, dim=-1)
    y = torch.zeros_like(x)
    mask = F.one_hot(topk, num_classes=w.shape[0]).permute(2, 0, 1)
    for e in range(w.shape[0]):
        BODY
    return y
"""
DIRECT = """tok, slot = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        y.index_add_(0, tok, (x[tok] @ w[e].T) * weights[tok, slot, None])"""
ALIAS = """m = mask[e]
        tok, slot = torch.nonzero(m, as_tuple=True)
        y.index_add_(0, tok, (x[tok] @ w[e].T) * weights[tok, slot, None])"""


def moe(body: str) -> str:
    return MOE.replace("BODY", body)


def inputs(tokens: int, experts: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(tokens, 8, generator=g),
        torch.randn(tokens, experts, generator=g) * 3,
        torch.randn(experts, 8, 8, generator=g),
    )


@pytest.mark.parametrize("body", [DIRECT, ALIAS], ids=["direct", "alias+nonzero"])
def test_the_hoisted_loop_is_bit_exact(body: str) -> None:
    source, count = hoist_wheres(moe(body))
    assert count == 1 and f"{HELPER}(mask)" in source
    assert "torch.where(mask[e])" not in source and "as_tuple" not in source.split("def run")[1]
    ref, new = module_from_source(moe(body)), module_from_source(source)
    for tokens, experts, seed in ((1, 4, 0), (7, 5, 1), (33, 16, 2)):  # idle experts too
        args = inputs(tokens, experts, seed)
        assert torch.equal(ref.run(*args), new.run(*args))


@pytest.mark.parametrize(
    "body",
    [
        DIRECT.replace("continue", "mask = mask.clone()"),  # re-bound in the loop
        DIRECT + "\n        mask[e].zero_()",  # written in place
        DIRECT + "\n        print(mask.sum())",  # used otherwise
        ALIAS + "\n        m.fill_(0)",  # the alias written
        ALIAS.replace("m = mask[e]", "m = mask[e]\n        m = m.t()"),  # alias bound twice
        DIRECT.replace("torch.where(mask[e])", "torch.where(mask[e], 1, 0)"),  # 3 arguments
        DIRECT.replace("mask[e]", "mask[e - 1]"),  # not the loop's own row
        DIRECT + "\n        e = 0",  # the loop variable assigned
    ],
    ids=["rebound", "zero_", "other-use", "alias-fill_", "alias-twice", "where3", "e-1", "e="],
)
def test_loops_that_could_change_the_mask_are_left_alone(body: str) -> None:
    source, count = hoist_wheres(moe(body))
    assert count == 0 and source == moe(body)


def test_only_range_loops_and_an_entry_function() -> None:
    src = moe(DIRECT).replace("for e in range(w.shape[0]):", "for e in [0, 1]:")
    assert hoist_wheres(src) == (src, 0)
    with pytest.raises(LoopRewriteError, match="no top-level function 'forward'"):
        hoist_wheres(moe(DIRECT), entry="forward")
    with pytest.raises(LoopRewriteError, match="syntax error"):
        hoist_wheres("def run(:\n")


def test_runtime_helper_falls_back_where_it_cannot_slice() -> None:
    rows = module_from_source(hoist_wheres(moe(DIRECT))[0]).__dict__[HELPER]
    flat = torch.tensor([0, 3, 0, 1])  # x[i] is 0-d: torch.where's own answer
    for i in range(4):
        got, want = rows(flat)(i), torch.where(flat[i])
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    m = torch.tensor([[[1, 0], [0, 1]], [[0, 0], [0, 0]]])
    helper = rows(m)
    assert [t.tolist() for t in helper(0)] == [[0, 1], [0, 1]]
    assert [t.tolist() for t in helper(-1)] == [[], []]  # negative rows, as indexing
    with pytest.raises(IndexError):  # out of range raises as torch.where(x[2]) does
        helper(2)


# ------------------------------------------------------------------ agent + real guard


@pytest.fixture(scope="module")
def moe_problem(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("moe_loop")
    return moe_loop_problem(root, "ka_test_moe_loop", moe(DIRECT))


def test_the_agent_proposes_the_hoisted_loop_and_it_passes_the_guard(
    moe_problem: Any, tmp_path: Path
) -> None:
    agent = RewriteAgent()
    ctx = agent_context(moe_problem)
    first = agent.propose(ctx)  # the grouped family comes first (test_rewrite_grouped.py)
    assert first is not None and first.tags == ("rewrite", "grouped")
    tried = [{"families": ["grouped"], "label": "x", "passed": False}]
    agent.restore(json.loads(json.dumps({**agent.state(), "tried": tried})))
    proposal = agent.propose(ctx)  # after a failed grouped candidate: the hoisted loop
    assert proposal is not None and proposal.tags == ("rewrite", "loops")
    assert "one wait" in proposal.hypothesis and "bit-exact" in proposal.hypothesis
    ev, statuses = cpu_guard_verdict(moe_problem, proposal, tmp_path)
    assert [s for s, _ in statuses] == ["PASSED", "PASSED"], statuses
    errors = [t.evaluation.correctness for t in ev.traces if t.evaluation is not None]
    assert len(errors) == 2 and all(c is not None and c.max_absolute_error == 0 for c in errors)
    assert agent.state()["families"] == ["grouped", "loops"]
    restored = RewriteAgent()
    restored.restore(json.loads(json.dumps(agent.state())))
    assert restored.state() == agent.state()
