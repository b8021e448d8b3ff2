"""The rewrite agent's ``matmul`` family: float32 GEMMs of upcast bf16/fp16 operands.

On the CPU: which calls are rewritten (mm, bmm, matmul, ``@``, F.linear with a float32 bias,
view chains after the cast) and which are not (an operand computed in float32, mixed half
dtypes, a bit-reinterpreting view, ranks the family does not take); that the rewritten graph
keeps every output's shape and dtype on meta tensors (``apply_families`` checks); that the
agent proposes the family for CUDA only. With a GPU: the emitted solution equals the float32
reference up to float32 summation order (a float64 reference bounds both).

Not covered on the CPU: running the rewritten code (``mm``/``bmm`` with ``out_dtype`` have
no CPU kernel).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _shared import module_from_source

from kernelarc.agents.types import AgentContext
from kernelarc.problem.inputs import load_reference_module
from kernelarc.problem.schema import Definition
from kernelarc.proposers.rewrite import RewriteAgent
from kernelarc.proposers.rewrite.rewrites import apply_families, families_for, solution_source

HEAD = (
    "import torch\nimport torch.nn.functional as F\n\n@torch.no_grad()\ndef run(a, b, c, bias):\n"
)
INPUTS = {
    "a": (["M", "K"], "bfloat16"),
    "b": (["N", "K"], "bfloat16"),
    "c": (["B", "M", "K"], "bfloat16"),
    "bias": (["N"], "float32"),
}


def definition(body: str, inputs: dict[str, tuple[list[str], str]] | None = None) -> Definition:
    return Definition.model_validate(
        {
            "name": "half_matmul_case",
            "axes": {
                "M": {"type": "var"},
                "K": {"type": "const", "value": 64},
                "N": {"type": "const", "value": 48},
                "B": {"type": "const", "value": 3},
            },
            "inputs": {n: {"shape": s, "dtype": d} for n, (s, d) in (inputs or INPUTS).items()},
            "outputs": {"out": {"shape": None, "dtype": "float32"}},
            "reference": HEAD + "".join(f"    {line}\n" for line in body.strip().splitlines()),
        }
    )


WORKLOADS = [{"M": 5}, {"M": 17}]


def rewritten(body: str, **kw: Any) -> tuple[int, str]:
    d = definition(body, **kw)
    r = apply_families(d, WORKLOADS, ["matmul"])
    return r.applied.get("half-matmul", 0), solution_source(d, r)


@pytest.mark.parametrize(
    "body",
    [
        "return a.float() @ b.float().t()",
        "return torch.mm(a.to(torch.float32), b.to(torch.float32).transpose(0, 1))",
        "return a.to(torch.float32).mm(b.float().T)",
        "return torch.matmul(a.float(), b.float().permute(1, 0))",
        "return F.linear(a.float(), b.float(), bias)",
        "return F.linear(c.float(), b.float())",
        "return torch.bmm(c.float(), c.float().transpose(1, 2))",
        "return c.float() @ c.float().transpose(-1, -2)",
        "return a.float().reshape(-1, 64) @ b.float().view(48, 64).t()",
        "return a.float() @ b.t().float()",  # the cast of a (transposed) half tensor
    ],
)
def test_upcast_half_operands_become_a_half_gemm_with_float32_output(body: str) -> None:
    sites, source = rewritten(body)
    assert sites == 1, source
    assert "out_dtype = torch.float32" in source
    calls = [ln for ln in source.splitlines() if "torch.mm(" in ln or "torch.bmm(" in ln]
    assert len(calls) == 1 and "to_" not in calls[0].split("=", 1)[1], source


@pytest.mark.parametrize(
    "body",
    [
        "return (a.float() * 2) @ b.float().t()",  # an operand computed in float32
        "return a.float() @ torch.ones_like(b, dtype=torch.float32).t()",  # a float32 operand
        "return a.float() @ b.double().float().t()",  # via float64: not a plain upcast
        "return a.view(torch.int16).float() @ b.float().t()",  # bits, not values
    ],
)
def test_operands_that_are_not_upcast_half_values_stay(body: str) -> None:
    assert rewritten(body)[0] == 0


def test_mixed_half_dtypes_and_broadcast_ranks_stay() -> None:
    mixed = {**INPUTS, "b": (["N", "K"], "float16")}
    assert rewritten("return a.float() @ b.float().t()", inputs=mixed)[0] == 0
    four = {**INPUTS, "c": (["B", "B", "M", "K"], "bfloat16")}
    assert rewritten("return c.float() @ c.float().transpose(-1, -2)", inputs=four)[0] == 0


def test_other_users_of_the_cast_keep_it() -> None:
    sites, source = rewritten("x = a.float()\nreturn (x @ b.float().t()) + x.sum()")
    assert sites == 1
    assert "a.float()" in source  # still needed by the sum


def context(d: Definition, device: str) -> AgentContext:
    return AgentContext.model_validate(
        {
            "problem": d.name,
            "definition": d,
            "device": device,
            "workloads": tuple(WORKLOADS),
            "budget_left": 10,
        }
    )


def test_the_agent_proposes_the_family_on_cuda_only() -> None:
    assert "matmul" in families_for("cuda:0") and "matmul" not in families_for("cpu")
    d = definition("return a.float() @ b.float().t()")
    cpu = RewriteAgent()
    assert cpu.propose(context(d, "cpu")) is None
    assert cpu.skipped is not None and "no rewrite" in cpu.skipped
    proposal = RewriteAgent().propose(context(d, "cuda"))
    assert proposal is not None and "matmul" in proposal.tags
    text = proposal.solution.sources[0].content
    assert "out_dtype = torch.float32" in text and "half-matmul x1" in text


@pytest.mark.gpu
@pytest.mark.parametrize(
    "body",
    [
        "return F.linear(c.float(), b.float(), bias)",
        "return torch.bmm(c.float(), c.float().transpose(1, 2))",
        "return a.float() @ b.float().t()",
    ],
)
def test_the_rewritten_solution_matches_the_float32_reference_on_cuda(body: str) -> None:
    d = definition(body)
    sites, source = rewritten(body)
    assert sites == 1
    ref, sol = load_reference_module(d, name="ref"), module_from_source(source)
    gen = torch.Generator().manual_seed(0)
    m = 300
    args = [
        torch.randn(m, 64, generator=gen).bfloat16().cuda(),
        torch.randn(48, 64, generator=gen).bfloat16().cuda(),
        torch.randn(3, m, 64, generator=gen).bfloat16().cuda(),
        torch.randn(48, generator=gen).cuda(),
    ]
    assert not torch.backends.cuda.matmul.allow_tf32, "the float32 reference must be IEEE"
    want, got = ref.run(*args), sol.run(*args)
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    # float32 sums of the same exact products (K = 64): only the summation order differs
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
