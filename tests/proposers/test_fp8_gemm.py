"""The ``fp8-gemm`` agent (``proposers/fp8_gemm.py``).

The problem here is written for these tests: a small FP8 projection with its own helper of
the same API as SOL-ExecBench's ``fp8_reference`` (``ScalingType``,
``CuBLASRefBlockwiseGemm.scaled_mm``: dequantise, float32 GEMM), 1x128 activation and
128x128 weight scales.

CPU: which references the agent accepts (and, with the shared problem tree, exactly the
FP8 ones of the dev set), the conformance contract, and a whole guard evaluation of its
solution — on the CPU the replaced method falls back to the emulation, so it must equal
the reference bit for bit; the same solution compiled by torch.compile, as the compiler
agent compiles board incumbents. GPU (skipped without CUDA): on sm90 the native path is
chosen and validated, and the guard passes the solution, compiled or not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _shared import shared_problems_root

from kernelarc.agents.conformance import check_agent, make_context
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.proposers.compile_board import why_not_compilable
from kernelarc.proposers.compiler import COMPILE_VARIANTS, compiled_base_solution
from kernelarc.proposers.fp8_gemm import Fp8GemmAgent, native_solution_source, why_not_applicable

REFERENCE = """import enum

import torch


class ScalingType(str, enum.Enum):
    TensorWise = "TensorWise"
    RowWise = "RowWise"
    BlockWise1x16 = "BlockWise1x16"
    BlockWise1x128 = "BlockWise1x128"
    BlockWise128x128 = "BlockWise128x128"


def _blocks(x, bm, bk):
    m, k = x.shape
    return x.reshape(m // bm, bm, k // bk, bk)


def quantize(x, bm, bk):
    xb = _blocks(x.float(), bm, bk)
    s = (xb.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    q = (xb / s[:, None, :, None]).clamp(-448.0, 448.0).reshape(x.shape)
    return q.to(torch.float8_e4m3fn), s


class CuBLASRefBlockwiseGemm:
    def scaled_mm(self, mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b,
                  bias=None, output_dtype=torch.bfloat16, use_fast_accum=True):
        a = (_blocks(mat_a.float(), 1, 128) * scale_a[:, None, :, None]).reshape(mat_a.shape)
        b = (_blocks(mat_b.float(), 128, 128) * scale_b[:, None, :, None]).reshape(mat_b.shape)
        y = a @ b.T
        if bias is not None:
            y = y + bias
        return y.to(output_dtype)


@torch.no_grad()
def run(x, w, bias):
    qx, sx = quantize(x, 1, 128)
    qw, sw = quantize(w, 128, 128)
    return CuBLASRefBlockwiseGemm().scaled_mm(
        qx, qw, sx, ScalingType.BlockWise1x128, sw, ScalingType.BlockWise128x128,
        bias=bias, output_dtype=torch.bfloat16, use_fast_accum=True,
    )
"""


def _write_problem(root: Path, reference: str = REFERENCE) -> Path:
    d = root / "fp8_proj"
    d.mkdir()
    definition = {
        "name": "fp8_proj",
        "axes": {"m": {"type": "var"}, "k": {"type": "const", "value": 256},
                 "n": {"type": "const", "value": 256}},
        "inputs": {"x": {"shape": ["m", "k"], "dtype": "bfloat16"},
                   "w": {"shape": ["n", "k"], "dtype": "bfloat16"},
                   "bias": {"shape": ["n"], "dtype": "bfloat16"}},
        "outputs": {"y": {"shape": ["m", "n"], "dtype": "bfloat16"}},
        "reference": reference,
    }  # fmt: skip
    (d / "definition.json").write_text(json.dumps(definition))
    lines = [
        {"uuid": f"w{m}", "axes": {"m": m},
         "inputs": {k: {"type": "random"} for k in ("x", "w", "bias")},
         "tolerance": {"max_atol": 0.05, "max_rtol": 0.02}}
        for m in (16, 64)
    ]  # fmt: skip
    (d / "workload.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


@pytest.fixture()
def problem(tmp_path: Path) -> Problem:
    return load_problem(_write_problem(tmp_path))


def test_applies_to_the_helper_with_native_recipes_only(problem: Problem) -> None:
    assert why_not_applicable(problem.definition) is None
    nvfp4 = REFERENCE.replace("ScalingType.BlockWise1x128, sw", "ScalingType.BlockWise1x16, sw")
    d = problem.definition.model_copy(update={"reference": nvfp4})
    assert "BlockWise1x16" in (why_not_applicable(d) or "")
    plain = problem.definition.model_copy(update={"reference": "def run(x, w, bias):\n  pass\n"})
    assert "does not define CuBLASRefBlockwiseGemm" in (why_not_applicable(plain) or "")
    renamed = REFERENCE.replace("scale_recipe_b,\n", "recipe_b,\n", 1)
    odd = problem.definition.model_copy(update={"reference": renamed})
    assert "unexpected signature" in (why_not_applicable(odd) or "")


def test_the_dev_set_fp8_problems_and_only_they_qualify() -> None:
    root = shared_problems_root()
    hits, seen = [], 0
    for d in sorted(p.parent for p in root.glob("*/*/definition.json")):
        seen += 1
        if why_not_applicable(load_problem(d).definition) is None:
            hits.append(d.name)
    assert seen >= 100 and hits, (seen, hits)
    assert all("_fp8_" in h for h in hits), hits
    assert len(hits) == len([d for d in root.glob("Quant/*_fp8_*/definition.json")]), hits


def test_proposes_once_on_cuda_and_never_on_the_cpu(problem: Problem) -> None:
    agent = Fp8GemmAgent()
    assert agent.propose(make_context(problem, "cpu", agent)) is None
    assert agent.skipped and "CUDA" in agent.skipped
    agent = Fp8GemmAgent()
    p = agent.propose(make_context(problem, "cuda", agent))
    assert p is not None and "CuBLASRefBlockwiseGemm.scaled_mm = _ka_disable(_ka_scaled_mm)" in (
        p.solution.sources[0].content or ""
    )
    assert agent.propose(make_context(problem, "cuda", agent)) is None
    check_agent(Fp8GemmAgent, problem, "cuda")


def _module(source: str) -> dict[str, object]:
    scope: dict[str, object] = {"__name__": "fp8_solution"}
    exec(compile(source, "<fp8 solution>", "exec"), scope)
    return scope


def test_on_the_cpu_the_solution_is_the_reference_bit_for_bit(problem: Problem) -> None:
    ref, sol = _module(REFERENCE), _module(native_solution_source(problem.definition))
    g = torch.Generator().manual_seed(0)
    shapes = ((32, 256), (256, 256), (256,))
    x, w, b = (torch.randn(*s, generator=g).to(torch.bfloat16) for s in shapes)
    assert torch.equal(sol["run"](x, w, b), ref["run"](x, w, b))  # type: ignore[operator]
    assert sol["_KA_CHOICE"] == {}  # the native path was not even considered off CUDA


def _assert_the_guard_passes_it(problem: Problem, cfg: GuardConfig, compiled: bool = False) -> None:
    agent = Fp8GemmAgent()
    p = agent.propose(make_context(problem, "cuda", agent))
    assert p is not None
    solution = p.solution
    if compiled:  # as the compiler agent compiles a board incumbent
        assert why_not_compilable(solution, problem.definition) is None
        solution = compiled_base_solution(
            solution, problem.definition, COMPILE_VARIANTS[0], name="fp8-compiled", what="fp8"
        )
    with Guard(problem, cfg) as guard:  # compiled: one workload (a compile per shape)
        res = guard.evaluate(solution, problem.workloads[:1] if compiled else None)
    assert res.all_passed, [t.evaluation and t.evaluation.log for t in res.traces]


def test_the_guard_passes_it_on_the_cpu(problem: Problem) -> None:
    _assert_the_guard_passes_it(
        problem, GuardConfig(device="cpu", rounds=2, warmup=1, iterations=3, warm_spare=False)
    )


def test_the_guard_passes_it_compiled_on_the_cpu(problem: Problem) -> None:
    _assert_the_guard_passes_it(
        problem,
        GuardConfig(device="cpu", rounds=2, warmup=1, iterations=3, warm_spare=False),
        compiled=True,
    )


needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="needs a CUDA device of compute capability 9.x",
)


@pytest.mark.gpu
@needs_sm90
def test_on_sm90_the_native_gemm_is_chosen_and_agrees(problem: Problem) -> None:
    ref, sol = _module(REFERENCE), _module(native_solution_source(problem.definition))
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((512, 256), (256, 256), (256,))
    x, w, b = (torch.randn(*s, generator=g, device="cuda").to(torch.bfloat16) for s in shapes)
    first = sol["run"](x, w, b)  # type: ignore[operator]
    assert torch.equal(first, ref["run"](x, w, b))  # type: ignore[operator]  # the check's call
    choice = sol["_KA_CHOICE"]  # one signature, and a native variant (index >= 0) chosen
    assert isinstance(choice, dict) and len(choice) == 1, choice
    assert all(v >= 0 for v in choice.values()), choice
    native = sol["run"](x, w, b)  # type: ignore[operator]
    torch.testing.assert_close(native.float(), first.float(), rtol=0.02, atol=0.05)


@pytest.mark.gpu
@needs_sm90
def test_the_guard_passes_it_on_sm90(problem: Problem) -> None:
    _assert_the_guard_passes_it(
        problem, GuardConfig(device="cuda", rounds=3, warmup=2, iterations=10, warm_spare=False)
    )


@pytest.mark.gpu
@needs_sm90
def test_the_guard_passes_it_compiled_on_sm90(problem: Problem) -> None:
    _assert_the_guard_passes_it(
        problem,
        GuardConfig(device="cuda", rounds=3, warmup=2, iterations=10, warm_spare=False),
        compiled=True,
    )


def test_scales_are_laid_out_as_torch_scaled_gemm_requires(problem: Problem) -> None:
    """torch's sm90 checks (ATen ScaledBlas.cpp): 1x128 scales [M, K/128] with strides
    (1, M); 128x128 scales [round_up(K/128, 4), N/128] with strides (1, round_up(K/128, 4));
    row-wise [M, 1] and [1, N]; tensor-wise one element. Values keep their blocks."""
    sol = _module(native_solution_source(problem.definition))
    st, layout = sol["ScalingType"], sol["_ka_scales"]
    m, k, n = 64, 640, 256  # K/128 = 5, padded to 8
    a = torch.zeros(m, k).to(torch.float8_e4m3fn)
    b = torch.zeros(n, k).to(torch.float8_e4m3fn)
    s_a, s_b = torch.rand(m, k // 128), torch.rand(n // 128, k // 128)
    sa, sb, names = layout(a, b, s_a, st.BlockWise1x128, s_b, st.BlockWise128x128)  # type: ignore[operator, attr-defined]
    assert names == ("BlockWise1x128", "BlockWise128x128")
    assert sa.shape == (m, 5) and sa.stride() == (1, m) and torch.equal(sa, s_a)
    assert sb.shape == (8, n // 128) and sb.stride() == (1, 8)
    assert torch.equal(sb[:5], s_b.t()) and torch.equal(sb[5:], torch.ones(3, n // 128))
    s_b1 = torch.rand(n, k // 128)
    _, sb1, _ = layout(a, b, s_a, st.BlockWise1x128, s_b1, st.BlockWise1x128)  # type: ignore[operator, attr-defined]
    assert sb1.shape == (n, 5) and sb1.stride() == (1, n) and torch.equal(sb1, s_b1)
    ra, rb, _ = layout(a, b, torch.rand(m), st.RowWise, torch.rand(n), st.RowWise)  # type: ignore[operator, attr-defined]
    assert ra.shape == (m, 1) and rb.shape == (1, n) and rb.stride(1) == 1
    ta, tb, _ = layout(a, b, torch.tensor(0.5), st.TensorWise, torch.tensor(2.0), st.TensorWise)  # type: ignore[operator, attr-defined]
    assert ta.numel() == tb.numel() == 1 and ta.dtype == torch.float32
    assert layout(a[:, :100], b[:, :100], s_a, st.BlockWise1x128, s_b, st.BlockWise128x128) is None  # type: ignore[operator, attr-defined]
