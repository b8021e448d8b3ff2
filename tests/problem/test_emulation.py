"""The low-precision emulation (``kernelarc.problem.emulation``) and its guard integration.

Covered: e2m1 codes and nibble order, e4m3 block scales (all 256 bit patterns, zero,
subnormal, 448), the swizzled 128x4 scale layout (against an explicit offset formula and the
layout SOL-ExecBench's NVFP4 references build), NVFP4 ``_scaled_mm`` on hand-built cases
with exactly known results and on random cases against an independent implementation, the
native op's argument checks, FP8 per-tensor/row-wise scaling against the native CPU op (and
native CUDA where present), the per-call dispatcher, and the real guard: the reference of
an NVFP4 problem runs emulated on the CPU (noted in the trace), a candidate bringing its own
kernel passes, a candidate relying on ``torch._scaled_mm`` does not get the emulation.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import shared_problems_root

from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem import emulation as emu
from kernelarc.problem.inputs import (
    estimate_input_bytes,
    generate_inputs,
    load_reference_module,
)
from kernelarc.problem.loader import load_problem
from kernelarc.problem.lowbit import pack_fp4x2
from kernelarc.problem.schema import Solution

FP4 = torch.float4_e2m1fn_x2
E4M3 = torch.float8_e4m3fn
#: The CPU kernel's refusal of block scales: torch 2.13's wording, then 2.11's.
CPU_REFUSES = "Invalid scaling configuration|only supports per-tensor scaling"

# An independent NVFP4 matmul, written from the bit-level definitions (no kernelarc code):
# used as a cross-check here and as the "own kernel" of candidate solutions.
OWN_SCALED_MM = """
def _own_scaled_mm(a, b, sa, sb, bias=None, out_dtype=None):
    import torch

    def values(rows_u8):
        lo, hi = rows_u8 & 15, rows_u8 >> 4
        codes = torch.stack((lo, hi), -1).reshape(rows_u8.shape[0], -1).to(torch.int64)
        e, m = (codes >> 1) & 3, (codes & 1).to(torch.float32)
        mag = torch.where(e == 0, 0.5 * m, torch.exp2((e - 1).to(torch.float32)) * (1 + m / 2))
        return torch.where((codes & 8) != 0, -mag, mag)

    def scales(flat, rows, blocks):
        bits = flat.reshape(-1).view(torch.uint8).to(torch.int64)
        r = torch.arange(rows).unsqueeze(1)
        c = torch.arange(blocks).unsqueeze(0)
        cp = -(-blocks // 4) * 4
        idx = ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
        byte = bits[idx + c % 4]
        e, m = (byte >> 3) & 15, (byte & 7).to(torch.float32)
        mag = torch.where(
            e == 0, m / 8 * 2.0**-6, torch.exp2((e - 7).to(torch.float32)) * (1 + m / 8)
        )
        return torch.where((byte & 128) != 0, -mag, mag)

    va = values(a.view(torch.uint8))
    vb = values(b.t().view(torch.uint8))
    k = va.shape[1]
    da = va * scales(sa, va.shape[0], k // 16).repeat_interleave(16, 1)
    db = vb * scales(sb, vb.shape[0], k // 16).repeat_interleave(16, 1)
    return (da @ db.t()).to(out_dtype)
"""
_ns: dict[str, Any] = {}
exec(OWN_SCALED_MM, _ns)
own_scaled_mm = _ns["_own_scaled_mm"]

E2M1_BY_CODE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_BY_CODE += [-v for v in E2M1_BY_CODE]


def e4m3_value(bits: int) -> float:
    sign = -1.0 if bits & 0x80 else 1.0
    e, m = (bits >> 3) & 15, bits & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return sign * m / 8 * 2.0**-6
    return sign * 2.0 ** (e - 7) * (1 + m / 8)


def e4m3(values: list[list[float]]) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    q = t.to(E4M3)
    assert torch.equal(q.to(torch.float32), t), "test values must be exact in e4m3"
    return q


def fp4_rows(codes: list[list[int]]) -> torch.Tensor:
    return pack_fp4x2(torch.tensor(codes, dtype=torch.uint8))


# ---------------------------------------------------------------- formats and layout


def test_all_16_e2m1_codes_and_the_nibble_order() -> None:
    codes = torch.arange(16, dtype=torch.uint8).reshape(1, 16)
    packed = pack_fp4x2(codes)  # (1, 8): byte i = code 2i (low) | code 2i+1 (high)
    assert packed.view(torch.uint8)[0, 0].item() == 0x10 and packed.view(torch.uint8)[0, 7] == 0xFE
    assert emu.fp4x2_values(packed, packed_dim=1)[0].tolist() == E2M1_BY_CODE
    # the same bytes seen as the (K/2, N) transposed view a reference passes as mat_b
    col = emu.fp4x2_values(packed.t(), packed_dim=0)
    assert col.shape == (16, 1) and col[:, 0].tolist() == E2M1_BY_CODE
    with pytest.raises(emu.EmulationError, match="contiguous"):
        emu.fp4x2_values(pack_fp4x2(torch.zeros(4, 4, dtype=torch.uint8)).t(), packed_dim=1)


def test_every_e4m3_scale_decodes_by_its_bits() -> None:
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(E4M3).reshape(1, 256)
    values = torch.ones(1, 256 * 16)
    got = emu.dequantize_blocks(values, bits, 16)[0, ::16].tolist()
    for b, v in enumerate(got):
        want = e4m3_value(b)
        assert (math.isnan(v) and math.isnan(want)) or v == want, (hex(b), v, want)
    assert got[0x01] == 2.0**-9 and got[0x7E] == 448.0 and got[0x00] == 0.0


def test_swizzle_matches_the_offset_formula_and_the_references_layout() -> None:
    rows, blocks = 130, 5  # both padded: to 256 rows and 8 blocks
    plain = torch.randint(0, 120, (rows, blocks), dtype=torch.uint8).view(E4M3)
    flat = emu.swizzle_scales(plain)
    assert flat.numel() == emu.swizzled_numel(rows, blocks) == 256 * 8
    raw = flat.view(torch.uint8)
    for r, c in [(0, 0), (1, 0), (31, 3), (32, 0), (127, 4), (128, 0), (129, 4)]:
        off = ((r // 128) * 2 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        assert raw[off] == plain.view(torch.uint8)[r, c], (r, c)
    back = emu.unswizzle_scales(flat, rows, blocks)
    assert torch.equal(back.view(torch.uint8), plain.view(torch.uint8))
    with pytest.raises(emu.EmulationError, match="need 2048 elements"):
        emu.unswizzle_scales(flat[:-1], rows, blocks)

    ref = load_reference_module(
        load_problem(shared_problems_root() / "Quant" / "020_nvfp4_linear_layer").definition
    )
    full = torch.randint(0, 120, (256, 8), dtype=torch.uint8).view(E4M3)
    theirs = ref.BlockWiseScalerNVFP4().convert_to_blocked_format_for_pytorch_scaled_mm(full)
    assert torch.equal(theirs.view(torch.uint8), emu.swizzle_scales(full).view(torch.uint8))


# ---------------------------------------------------------------- NVFP4 arithmetic


def _nvfp4_case() -> tuple[torch.Tensor, ...]:
    """M=2, K=32, N=16 with edge-case scales; returns a, b (K/2, N view), sa, sb, expected."""
    a_codes = [[2] * 16 + [7] * 16, [15] * 16 + [1] * 16]  # [1.0 | 6.0], [-6.0 | 0.5]
    a_scale = [[1.0, 448.0], [2.0**-9, 0.0]]  # max, subnormal, zero
    b_codes = [[(i + j) % 16 for j in range(32)] for i in range(16)]  # every code per row
    b_scale = [[1.0 + (i % 8) / 8, 2.0 ** -(i % 7)] for i in range(16)]
    a, b = fp4_rows(a_codes), fp4_rows(b_codes).t()
    sa, sb = e4m3(a_scale), e4m3(b_scale)
    expected = torch.zeros(2, 16, dtype=torch.float64)
    for m in range(2):
        for n in range(16):
            total = Fraction(0)
            for k in range(32):
                av = Fraction(E2M1_BY_CODE[a_codes[m][k]]) * Fraction(a_scale[m][k // 16])
                bv = Fraction(E2M1_BY_CODE[b_codes[n][k]]) * Fraction(b_scale[n][k // 16])
                total += av * bv
            expected[m, n] = float(total)
    return a, b, emu.swizzle_scales(sa), emu.swizzle_scales(sb), expected


def test_nvfp4_scaled_mm_equals_the_exact_arithmetic() -> None:
    a, b, sa, sb, expected = _nvfp4_case()
    assert emu.classify(a, b, sa, sb) == emu.NVFP4
    out32 = emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert out32.dtype == torch.float32 and out32.shape == (2, 16)
    # every partial sum here is exact in float32, so the result is the exact value
    assert torch.equal(out32.double(), expected)
    out16 = emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert torch.equal(out16, expected.float().to(torch.bfloat16)), "one rounding, to bf16"


def test_nvfp4_random_cases_agree_with_an_independent_implementation() -> None:
    gen = torch.Generator().manual_seed(5)
    for m, n, k in [(128, 32, 64), (200, 48, 96)]:  # the second pads rows and blocks
        a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, generator=gen).view(FP4)
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen).view(FP4)
        scale_bits = (0, 0x7E)  # finite e4m3 only (0x7F is NaN)
        sa = torch.randint(*scale_bits, (m, k // 16), dtype=torch.uint8, generator=gen)
        sb = torch.randint(*scale_bits, (n, k // 16), dtype=torch.uint8, generator=gen)
        fa, fb = emu.swizzle_scales(sa.view(E4M3)), emu.swizzle_scales(sb.view(E4M3))
        got = emu.emulated_scaled_mm(a, w.t(), fa, fb, out_dtype=torch.float32)
        want = own_scaled_mm(a, w.t(), fa, fb, out_dtype=torch.float32)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_the_native_argument_checks_are_kept() -> None:
    a, b, sa, sb, _ = _nvfp4_case()
    with pytest.raises(emu.EmulationError, match="use_fast_accum"):
        emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    bias = torch.zeros(16, dtype=torch.bfloat16)
    with pytest.raises(emu.EmulationError, match="float32"):
        emu.emulated_scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    biased = emu.emulated_scaled_mm(a, b, sa, sb, bias=bias + 1, out_dtype=torch.bfloat16)
    plain = emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert torch.equal(biased, (plain + 1).to(torch.bfloat16))
    assert emu.classify(a, b, sa[:-1], sb) == emu.OTHER
    with pytest.raises(emu.EmulationError, match="not emulated"):
        emu.emulated_scaled_mm(a, b, sa[:-1], sb, out_dtype=torch.bfloat16)


# ---------------------------------------------------------------- FP8 against native


def _fp8_operands(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(64, 96, generator=gen) * 3).to(E4M3).to(device)
    b = (torch.randn(48, 96, generator=gen) * 3).to(E4M3).to(device).t()
    return a, b


def _fp8_scales(device: str, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == emu.TENSORWISE:
        return torch.tensor(0.37, device=device), torch.tensor(1.9, device=device)
    sa = torch.linspace(0.1, 2.0, 64, device=device).reshape(64, 1)
    return sa, torch.linspace(0.5, 3.0, 48, device=device).reshape(1, 48)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("kind", [emu.TENSORWISE, emu.ROWWISE])
def test_fp8_scaled_mm_agrees_with_the_native_op(device: str, kind: str) -> None:
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("this GPU has no native FP8 matmul")
    if device == "cpu" and not emu.has_native(kind, torch.device("cpu")):
        pytest.skip(f"this torch's CPU _scaled_mm has no {kind} kernel (torch 2.11)")
    a, b = _fp8_operands(device)
    sa, sb = _fp8_scales(device, kind)
    assert emu.classify(a, b, sa, sb) == kind and emu.has_native(kind, a.device)
    native = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    got = emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert got.dtype == native.dtype and got.shape == native.shape == (64, 48)
    n16 = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    g16 = emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    if device == "cuda" and torch.cuda.get_device_capability() < (10, 0):
        # Ada/Hopper FP8 tensor cores accumulate in a reduced-precision (about 13 mantissa
        # bits, truncating) register before cuBLAS promotes to float32: the native result
        # is within a few 2^-13 of the sum of |products| (truncation errors of one sign add
        # up over a promotion interval); the emulation is exact. 2^-9 leaves room for that
        # and still fails any semantic difference (a scale, an input rounding: errors ~1).
        mag = (a.float().abs() @ b.float().abs()).double() * (sa * sb).double()
        err = (got.double() - native.double()).abs()
        worst = float((err / mag.clamp_min(1e-30)).max())
        assert worst <= 2**-9, f"native differs by {worst:.2e} of sum|products| (> 2^-9)"
        torch.testing.assert_close(
            g16.float(), n16.float(), rtol=2**-7, atol=mag.max().item() * 2**-9
        )
        return
    # the same exact products; only the float32 summation order may differ
    torch.testing.assert_close(got, native, rtol=1e-5, atol=1e-3)
    mismatch = (n16 != g16).float().mean().item()
    assert mismatch < 0.02, f"{mismatch:.1%} bf16 outputs differ (at most one ulp expected)"
    torch.testing.assert_close(g16.float(), n16.float(), rtol=2**-7, atol=1e-3)


@pytest.mark.gpu
def test_nvfp4_agrees_with_the_native_op_where_there_is_one() -> None:
    if torch.cuda.get_device_capability() < (10, 0):
        pytest.skip("native NVFP4 needs a CUDA device of compute capability 10.0+")
    gen = torch.Generator().manual_seed(9)
    a = torch.randint(0, 256, (128, 64), dtype=torch.uint8, generator=gen).view(FP4).cuda()
    w = torch.randint(0, 256, (64, 64), dtype=torch.uint8, generator=gen).view(FP4).cuda()
    s = torch.randint(0, 0x7E, (128, 8), dtype=torch.uint8, generator=gen).view(E4M3)
    fa = emu.swizzle_scales(s).cuda()
    fb = emu.swizzle_scales(s[:64]).cuda()
    native = torch._scaled_mm(a, w.t(), fa, fb, out_dtype=torch.float32)
    got = emu.emulated_scaled_mm(a, w.t(), fa, fb, out_dtype=torch.float32)
    torch.testing.assert_close(got, native, rtol=1e-5, atol=1e-3)


# ---------------------------------------------------------------- the dispatcher


def test_dispatcher_emulates_only_what_the_device_lacks() -> None:
    native = torch._scaled_mm
    a8, b8 = _fp8_operands("cpu")
    s8 = _fp8_scales("cpu", emu.TENSORWISE)
    a, b, sa, sb, expected = _nvfp4_case()
    with pytest.raises(Exception, match=CPU_REFUSES):
        torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)  # the CPU has no NVFP4 kernel
    with emu.emulation() as record:
        assert torch._scaled_mm is not native
        out = torch._scaled_mm(a, b, sa, sb, bias=None, out_dtype=torch.float32)
        assert torch.equal(out.double(), expected)
        fp8 = torch._scaled_mm(a8, b8, *s8, out_dtype=torch.bfloat16)
        assert torch.equal(fp8, native(a8, b8, *s8, out_dtype=torch.bfloat16)), "native FP8"
        with pytest.raises(Exception, match=CPU_REFUSES):
            torch._scaled_mm(a, b, sa[:-1], sb, out_dtype=torch.float32)  # native's own error
        assert emu.install() is record, "installing twice keeps one dispatcher"
    assert torch._scaled_mm is native
    assert record.emulated_calls == 1 and record.native_calls == 2
    assert record.describe() == [f"torch._scaled_mm[{emu.NVFP4}]"]
    assert not emu.has_native(emu.NVFP4, torch.device("cpu"))
    assert emu.has_native(emu.TENSORWISE, torch.device("cpu"))


# ---------------------------------------------------------------- the real guard


def _own_kernel_solution(problem: Any) -> Solution:
    """The reference itself as a pytorch solution, its ``_scaled_mm`` calls replaced by
    :data:`OWN_SCALED_MM` (a candidate must bring its own kernel)."""
    source = problem.definition.reference
    assert "torch._scaled_mm(" in source
    source = source.replace("torch._scaled_mm(", "_own_scaled_mm(") + "\n" + OWN_SCALED_MM
    return _solution(problem, source, "own-nvfp4-kernel")


def _solution(problem: Any, source: str, name: str) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": problem.definition.name,
            "author": "kernelarc-tests",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "s.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "s.py", "content": source}],
        }
    )


def _small_linear_problem(tmp_path: Path) -> Any:
    """SOL-ExecBench's NVFP4 linear layer with its features cut to 256 -> 128."""
    src = shared_problems_root() / "Quant" / "020_nvfp4_linear_layer"
    definition = json.loads((src / "definition.json").read_text())
    definition["axes"]["in_features"]["value"] = 256
    definition["axes"]["out_features"]["value"] = 128
    first = json.loads((src / "workload.jsonl").read_text().splitlines()[0])
    first["axes"] = {"batch_size": 1, "seq_len": 128}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "definition.json").write_text(json.dumps(definition))
    (tmp_path / "workload.jsonl").write_text(json.dumps(first) + "\n")
    return load_problem(tmp_path)


def _config(tmp_path: Path) -> GuardConfig:
    return GuardConfig(
        device="cpu",
        rounds=1,
        warmup=0,
        iterations=1,
        time_reference=False,
        timeout=240,
        cache_dir=tmp_path / "cache",
    )


def test_the_emulated_reference_equals_an_independent_kernel(tmp_path: Path) -> None:
    problem = _small_linear_problem(tmp_path / "problem")
    module = load_reference_module(problem.definition)
    own: dict[str, Any] = {}
    exec(_own_kernel_solution(problem).sources[0].content, own)
    for seed in (200, 201):
        values = generate_inputs(
            problem.definition,
            problem.workloads[0],
            device="cpu",
            seed=seed,
            problem_root=problem.root,
            reference_module=module,
        ).values
        with emu.emulation() as record:
            ref = module.run(*values.values())
        assert record.emulated_calls == 1 and ref.dtype == torch.bfloat16
        assert torch.equal(ref, own["run"](*values.values()))


def test_guard_runs_an_nvfp4_reference_emulated(tmp_path: Path) -> None:
    problem = _small_linear_problem(tmp_path / "problem")
    leaning = problem.definition.reference + "\n\n_unused = None\n"  # torch._scaled_mm as is
    with Guard(problem, _config(tmp_path)) as guard:
        ok = guard.evaluate(_own_kernel_solution(problem))
        bad = guard.evaluate(_solution(problem, leaning, "leans-on-scaled-mm"))
    trace = ok.traces[0].evaluation
    assert trace is not None and trace.status.value == "PASSED", trace and trace.log
    assert f"reference ran emulated: torch._scaled_mm[{emu.NVFP4}]" in trace.log
    # (not bit-exact through the guard: its re-check round reuses the last timed call's
    # scalar inputs, here the weight's global decode scale; exactness is checked in-process)
    correctness = trace.correctness
    assert correctness is not None and (correctness.extra or {})["min_matched_ratio"] == 1
    other = bad.traces[0].evaluation
    assert other is not None and other.status.value == "RUNTIME_ERROR", other and other.log
    assert "Invalid scaling configuration" in other.log, "candidates get no emulation"


def test_a_real_nvfp4_problem_runs_its_smallest_workload_on_the_cpu(tmp_path: Path) -> None:
    problem = load_problem(
        shared_problems_root() / "Quant" / "033_nvfp4_moe_routing_with_topk_selection"
    )
    smallest = min(problem.workloads, key=lambda w: estimate_input_bytes(problem.definition, w))
    with Guard(problem, _config(tmp_path)) as guard:
        result = guard.evaluate(_own_kernel_solution(problem), [smallest])
    trace = result.traces[0].evaluation
    assert trace is not None and trace.status.value == "PASSED", trace and trace.log
    assert "reference ran emulated: torch._scaled_mm[NVFP4" in trace.log
