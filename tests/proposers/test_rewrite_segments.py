"""The grouped family's sorted-segment form (``proposers/rewrite/segments.py``): a
DeepSeek-style ``moe_infer`` loop over consecutive row segments of the expert-sorted
tokens, replaced by one ``vmap`` of its body over all experts.

Covered: the batched source against the reference, in float64, for the L2 048 form
(``range`` loop, ``int(counts[e])``, ``continue`` on empty experts, ``end = start + c``,
``start = end``, ``torch.cat`` after a ``len(outputs) == 0`` guard) and the ``enumerate``
form (``if not c``, ``X[start:start + c]``, ``start += c``; over a list, or over a tensor
with ``c.item()``; DeepSeek-V3's ``moe_infer`` order, ``end`` set before the ``continue`` and
``len(outputs)`` as the test of a conditional expression), experts without rows; each
run-time fallback (float counts, a segmented tensor with more rows than the counts, one
expert taking most rows, no rows at all) taking the loop as written; the helper's checks;
the refusals of near-miss forms; the real L2 048 reference (when the shared problem tree is
there) batched and close to the original at its own bfloat16 output; the agent proposing
it as the grouped family and the candidate PASSING the real guard on the CPU.

Not covered: speed and CUDA; bodies that mix rows (the guard's tolerance check judges).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import (
    agent_context,
    batched_runs,
    cpu_guard_verdict,
    module_from_source,
    moe_loop_problem,
    shared_problems_root,
)

from kernelarc.proposers.rewrite import RewriteAgent
from kernelarc.proposers.rewrite.grouped import group_loops
from kernelarc.proposers.rewrite.segments import HELPER

SEGMENTS = """import torch


@torch.no_grad()
def run(x, router, w):
    weights, topk = torch.topk(router.softmax(dim=-1), 2, dim=-1)
    num_experts = w.shape[0]
    cnts = torch.zeros((x.shape[0], num_experts), dtype=torch.int32, device=x.device)
    cnts.scatter_(1, topk, 1)
    tokens_per_expert = cnts.sum(dim=0)
    idxs = topk.view(-1).argsort()
    sorted_tokens = x[idxs // 2]
    outputs = []
    start_idx = 0
    counts = tokens_per_expert.cpu().numpy()
    for expert_id in range(num_experts):
        num = int(counts[expert_id])
        if num == 0:
            continue
        end_idx = start_idx + num
        expert_input = sorted_tokens[start_idx:end_idx]
        gate = torch.matmul(expert_input, w[expert_id].t())
        out = gate * torch.sigmoid(gate) @ w[expert_id]
        outputs.append(out)
        start_idx = end_idx
    if len(outputs) == 0:
        return torch.zeros_like(x)
    all_outputs = torch.cat(outputs, dim=0)
    y = torch.zeros_like(all_outputs)
    y[idxs] = all_outputs
    return (y.view(-1, 2, x.shape[-1]) * weights.unsqueeze(-1)).sum(dim=1)
"""

ENUMERATE = (
    SEGMENTS.replace("    counts = tokens_per_expert.cpu().numpy()\n", "")
    .replace(
        "for expert_id in range(num_experts):\n        num = int(counts[expert_id])\n"
        "        if num == 0:",
        "for expert_id, num in enumerate(tokens_per_expert.tolist()):\n        if not num:",
    )
    .replace("        end_idx = start_idx + num\n", "")
    .replace("[start_idx:end_idx]", "[start_idx:start_idx + num]")
    .replace("start_idx = end_idx", "start_idx += num")
)

DEEPSEEK = (
    SEGMENTS.replace(
        "for expert_id in range(num_experts):\n        num = int(counts[expert_id])\n"
        "        if num == 0:\n            continue\n        end_idx = start_idx + num\n",
        "for expert_id, num in enumerate(counts):\n        end_idx = start_idx + num\n"
        "        if num == 0:\n            continue\n",
    )
    .replace("    if len(outputs) == 0:\n        return torch.zeros_like(x)\n", "")
    .replace(
        "all_outputs = torch.cat(outputs, dim=0)",
        "all_outputs = torch.cat(outputs, dim=0) if len(outputs) else sorted_tokens.new_empty(0)",
    )
)  # DeepSeek-V3's ``moe_infer``: ``end`` before the ``continue``, ``len(outputs)`` as a test

ITEM = ENUMERATE.replace(
    "for expert_id, num in enumerate(tokens_per_expert.tolist()):",
    "for expert_id, c in enumerate(tokens_per_expert):\n        num = c.item()",
)  # a tensor of counts, each converted by ``.item()``


def args_for(tokens: int, seed: int, skew: bool = False, experts: int = 6) -> list:
    g = torch.Generator().manual_seed(seed)
    router = torch.randn(tokens, experts, generator=g, dtype=torch.float64)
    if skew:
        router[:, 0] += 50.0  # every token picks expert 0
    x = torch.randn(tokens, 8, generator=g, dtype=torch.float64)
    w = torch.randn(experts, 8, 8, generator=g, dtype=torch.float64)
    return [x, router, w]


@pytest.mark.parametrize(
    "reference",
    [SEGMENTS, ENUMERATE, ITEM, DEEPSEEK],
    ids=["range", "enumerate", "enumerate-item", "deepseek"],
)
def test_the_batched_segments_compute_the_reference(reference: str) -> None:
    source, count, refused = group_loops(reference)
    assert (count, refused) == (1, [])
    assert "torch.func.vmap(_ka_seg1)" in source and "_KaGroups" not in source
    call = {
        SEGMENTS: "(counts, _ka_n1, (sorted_tokens,), (w,))",
        ENUMERATE: "(_ka_c1, None, (sorted_tokens,), (w,))",
        ITEM: "(tokens_per_expert, None, (sorted_tokens,), (w,))",
        DEEPSEEK: "(counts, None, (sorted_tokens,), (w,))",
    }[reference]
    assert HELPER + call in source
    ref, new = module_from_source(reference), module_from_source(source)
    seen = batched_runs(new, HELPER)
    for tokens, seed in ((1, 0), (3, 1), (7, 2), (64, 3)):  # idle experts in all but the last
        args = args_for(tokens, seed)
        want, got = ref.run(*args), new.run(*args)
        assert want.shape == got.shape and torch.allclose(want, got, rtol=1e-12, atol=1e-12)
    assert seen == [True] * 4  # the batched branch ran each time, not the loop as written


FALLBACKS = {
    "float-counts": (SEGMENTS.replace(".cpu().numpy()", ".cpu().double().numpy()"), {}),
    "extra-rows": (SEGMENTS.replace("x[idxs // 2]", "torch.cat([x[idxs // 2], x[:1]])"), {}),
    "skewed": (SEGMENTS, {"skew": True}),  # 40 of 80 rows in one expert of 6
    "no-rows": (SEGMENTS, {"tokens": 0}),
    "enumerate-skewed": (ENUMERATE, {"skew": True}),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_the_loop_as_written_runs_where_the_segments_do_not_fit(case: str) -> None:
    reference, kw = FALLBACKS[case]
    source, count, _ = group_loops(reference)
    assert count == 1
    new = module_from_source(source)
    seen = batched_runs(new, HELPER)
    args = args_for(kw.get("tokens", 40), 4, skew=kw.get("skew", False))
    want, got = module_from_source(reference).run(*args), new.run(*args)
    assert want.shape == got.shape and torch.allclose(want, got, rtol=1e-12, atol=1e-12)
    assert seen == [False]


def test_the_helper_pads_and_takes_back_rows_in_expert_order() -> None:
    helper = module_from_source(group_loops(SEGMENTS)[0]).__dict__[HELPER]
    x = torch.arange(5.0).unsqueeze(-1)
    w = torch.zeros(3, 2)
    seg = helper([2, 0, 3], None, (x,), (w,))
    assert seg.ok and (seg.n, seg.m) == (3, 3)
    assert seg.pad(x)[..., 0].tolist() == [[0, 1, 0], [0, 0, 0], [2, 3, 4]]
    assert torch.equal(seg.kept(seg.pad(x) * 2), x * 2)
    with pytest.raises(RuntimeError, match="not rows-first"):
        seg.kept(torch.zeros(3, 2))
    assert helper(torch.tensor([2, 0, 3]), 3, (x,), (w,)).ok
    assert helper([2, 0, 3, 7], 3, (x,), ()).ok  # n of 4 counts: the first 3
    assert not helper(torch.tensor([2.0, 0.0, 3.0]), None, (x,), ()).ok  # float counts
    assert not helper(torch.tensor([[2, 0, 3]]), None, (x,), ()).ok  # two-dimensional
    assert not helper([2, -1, 4], None, (x,), ()).ok  # a negative count
    assert not helper([2, True, 2], None, (x,), ()).ok  # not plain ints
    assert not helper([2, 0, 3], 4, (x,), ()).ok  # more experts than counts
    assert not helper([2, 0, 2], None, (x,), ()).ok  # the counts do not cover x
    assert not helper([2, 0, 3], None, (x,), (w[:2],)).ok  # W has too few experts
    assert not helper([2, 0, 3], None, (x.tolist(),), ()).ok  # x not a tensor
    assert not helper([0, 0], None, (x[:0],), ()).ok  # no rows at all
    assert not helper([5, 0, 0, 0], None, (x,), ()).ok  # padding: 20 rows for 5


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (("[start_idx:end_idx]", "[start_idx:end_idx + 1]"), "'start_idx' used other than"),
        (("w[expert_id].t())", "w[expert_id].t()) * num"), "'num' used other than"),
        (("w[expert_id].t())", "w[expert_id].t()) * expert_id"), "'expert_id' used other"),
        (("torch.cat(outputs, dim=0)", "torch.cat(outputs, dim=1)"), "other than by torch.cat"),
        (("len(outputs) == 0", "len(outputs) == 1"), "other than by torch.cat"),
        (("    outputs = []\n", "    outputs = [x[:0]]\n"), "no `outputs = []` before"),
        (("    start_idx = 0\n", "    start_idx = 1\n"), "no `start_idx = 0` before"),
        (("start_idx = end_idx\n", "start_idx = end_idx + 1\n"), "moves to other than `end`"),
        (("        start_idx = end_idx\n", ""), "no `start = end` or `start += c`"),
        (
            ("        outputs.append(out)\n", "        print(out)\n        outputs.append(out)\n"),
            "Expr statements are not batched",
        ),
        (("gate = torch.matmul(", "gate = gate + torch.matmul("), "read before it is assigned"),
        (("    return (y.view", "    print(gate)\n    return (y.view"), "read outside the loop"),
        (
            ("if num == 0:\n            continue", "if num == 0:\n            break"),
            "If statements are not batched",
        ),
        (
            ("        expert_input = ", "        start_idx = end_idx\n        expert_input = "),
            "moves twice",
        ),
        (("[start_idx:end_idx]", "[start_idx:end_idx] + x[expert_id:]"), "not at one `start`"),
        (
            (
                "        num = int(counts[expert_id])\n",
                "        num = int(counts[expert_id])\n        outputs.append(x)\n",
            ),
            "appended to twice",
        ),
        (("num = int(counts[expert_id])", "num = int(counts[expert_id]) + 1"), "does not start"),
    ],
)
def test_segment_loops_it_cannot_batch_are_left_alone(edit: tuple[str, str], why: str) -> None:
    reference = SEGMENTS.replace(*edit)
    assert reference != SEGMENTS
    source, count, refused = group_loops(reference)
    assert (source, count) == (reference, 0)
    assert len(refused) == 1 and "segments: " in refused[0] and why in refused[0], refused


def test_a_slice_after_start_moves_is_refused() -> None:
    reference = ENUMERATE.replace(
        "        start_idx += num\n",
        "        start_idx += num\n        ahead = sorted_tokens[start_idx:start_idx + num]\n",
    )
    source, count, refused = group_loops(reference)
    assert count == 0 and len(refused) == 1 and "after `start` moves" in refused[0], refused


# ------------------------------------------------------------------ L2 048, agent + guard

L2_048 = "L2/048_moe_expert_inference_batched_dispatch"


def test_the_real_l2_048_reference_is_batched() -> None:
    root = shared_problems_root()
    definition = json.loads((root / L2_048 / "definition.json").read_text())
    reference = definition["reference"]
    source, count, refused = group_loops(reference)
    assert (count, refused) == (1, [])
    ref, new = module_from_source(reference), module_from_source(source)
    seen = batched_runs(new, HELPER)
    axes = {"num_tokens": 48, "hidden_size": 16, "intermediate_size": 8}
    torch.manual_seed(0)
    inputs = ref.get_inputs({**axes, "num_experts": 8, "num_experts_per_tok": 2}, "cpu")
    want, got = ref.run(**inputs), new.run(**inputs)
    assert seen == [True]
    assert want.dtype == got.dtype == torch.bfloat16 and want.shape == got.shape
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-6)  # float32 inside, bf16 out


@pytest.fixture(scope="module")
def segments_problem(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("moe_segments")
    return moe_loop_problem(root, "ka_test_moe_segments", SEGMENTS)


def test_the_agent_proposes_the_segments_as_grouped_and_they_pass_the_guard(
    segments_problem: Any, tmp_path: Path
) -> None:
    agent = RewriteAgent()
    proposal = agent.propose(agent_context(segments_problem))
    assert proposal is not None and proposal.tags == ("rewrite", "grouped")
    assert agent.state()["families"] == ["grouped"]
    assert "torch.func.vmap(_ka_seg1)" in proposal.solution.sources[0].content
    ev, statuses = cpu_guard_verdict(segments_problem, proposal, tmp_path)
    assert [s for s, _ in statuses] == ["PASSED", "PASSED"], statuses
