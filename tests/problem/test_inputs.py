"""Tests of kernelarc.problem.inputs and lowbit: seed protocol, every naming heuristic,
scalars, custom entrypoints, safetensors blobs, FP4 packing, and a sweep over the shared
problems (CPU, time-boxed)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import shared_problems_root

from kernelarc.errors import InputGenerationError, MissingBlobError
from kernelarc.problem import lowbit
from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.inputs import (
    GeneratedInputs,
    estimate_input_bytes,
    generate_inputs,
    load_reference_module,
    torch_dtype,
)
from kernelarc.problem.schema import Definition, DType, SafetensorsInput, Workload

Spec = tuple[list[str] | None, str]


def make_def(
    inputs: dict[str, Spec],
    axes: dict[str, Any] | None = None,
    *,
    extra_source: str = "",
    entrypoint: str | None = None,
    name: str = "toy",
) -> Definition:
    params = ", ".join(inputs)
    first = next(iter(inputs))
    source = f"import torch\n{extra_source}\ndef run({params}):\n    return {first}\n"
    return Definition.model_validate(
        {
            "name": name,
            "axes": axes or {"n": {"type": "var"}, "d": {"type": "const", "value": 8}},
            "inputs": {k: {"shape": s, "dtype": d} for k, (s, d) in inputs.items()},
            "outputs": {"out": {"shape": None, "dtype": "float32"}},
            "reference": source,
            "custom_inputs_entrypoint": entrypoint,
        }
    )


def make_wl(axes: dict[str, int] | None = None, **inputs: Any) -> Workload:
    return Workload.model_validate({"uuid": "w0", "axes": axes or {"n": 4}, "inputs": inputs})


def gen(defn: Definition, wl: Workload | None = None, seed: int = 0, **kw: Any) -> GeneratedInputs:
    return generate_inputs(
        defn, wl or make_wl(), device="cpu", seed=seed, problem_root=kw.pop("root", None), **kw
    )


def one(name: str, shape: list[str] | None, dtype: str = "float32", **axes: int) -> Any:
    """The generated value of a single-input definition with axes n (var), d=8 and more."""
    ax: dict[str, Any] = {"n": {"type": "var"}, "d": {"type": "const", "value": 8}}
    ax.update({k: {"type": "const", "value": v} for k, v in axes.items()})
    return gen(make_def({name: (shape, dtype)}, ax)).values[name]


# ---------------------------------------------------------------- dtypes, reference module


def test_torch_dtype_maps_every_dtype() -> None:
    assert torch_dtype(DType.bfloat16) is torch.bfloat16
    assert torch_dtype(DType.float8_e4m3fn) is torch.float8_e4m3fn
    assert torch_dtype(DType.float4_e2m1) is torch.uint8
    assert torch_dtype(DType.float4_e2m1fn_x2) is torch.float4_e2m1fn_x2
    assert torch_dtype(DType.bool) is torch.bool
    for dt in DType:
        assert isinstance(torch_dtype(dt), torch.dtype)


def test_reference_module_is_fresh_and_errors_carry_the_traceback() -> None:
    defn = make_def({"x": (["n"], "float32")}, extra_source="MARK = object()\n")
    a, b = load_reference_module(defn), load_reference_module(defn, name="other")
    assert a.MARK is not b.MARK and b.__name__ == "other"
    assert "kernelarc_reference" not in sys.modules
    assert a.run.__code__.co_filename == "<reference:toy>"
    bad = make_def({"x": (["n"], "float32")}, extra_source="def f():\n    return 1 / 0\nf()\n")
    with pytest.raises(InputGenerationError) as e:
        load_reference_module(bad)
    text = str(e.value)
    assert "ZeroDivisionError" in text and "<reference:toy>" in text and "return 1 / 0" in text


# ---------------------------------------------------------------- seed protocol

MIXED: dict[str, Spec] = {
    "x": (["n", "d"], "bfloat16"),
    "w_proj": (["d", "d"], "float8_e4m3fn"),
    "q": (["n", "d"], "float4_e2m1fn_x2"),
    "ids": (["n"], "int64"),
    "flag": (["n"], "bool"),
    "s": (None, "float32"),
}


def test_same_seed_same_inputs_other_seed_differs() -> None:
    defn = make_def(MIXED)
    a, b, c = gen(defn, seed=7), gen(defn, seed=7), gen(defn, seed=8)
    assert list(a.values) == list(MIXED)
    for k in ("x", "w_proj", "q", "ids", "flag"):
        ta, tb, tc = (v.values[k].view(torch.uint8) for v in (a, b, c))
        assert torch.equal(ta, tb), k
        assert not torch.equal(ta, tc), k
    assert a.values["s"] == b.values["s"] != c.values["s"]


def test_global_rng_state_does_not_leak_in() -> None:
    defn = make_def({"x": (["n", "d"], "float32")})
    first = gen(defn, seed=3).values["x"]
    torch.randn(100)  # disturb the global generator
    assert torch.equal(first, gen(defn, seed=3).values["x"])


# ---------------------------------------------------------------- float heuristics


def test_norm_parameters_are_ones_and_zeros() -> None:
    for name in ("input_layernorm_weight", "layer_norm1_weight", "ln_weight", "down1_gn_weight",
                 "q_norm_weight", "rmsnorm_gamma"):  # fmt: skip
        assert torch.equal(one(name, ["d"]), torch.ones(8)), name
    for name in ("norm2_bias", "layernorm_bias", "q_norm_bias", "ln_beta"):
        assert torch.equal(one(name, ["d"]), torch.zeros(8)), name
    # not norm parameters: a normalized activation, a bare weight, a gradient
    for name in ("x_norm", "weight", "grad_norm_weight"):
        assert one(name, ["d"]).std() > 0.1, name


def test_causal_and_binary_masks() -> None:
    m = one("attention_mask", ["n", "one", "s", "s"], one=1, s=5)
    lo = torch.finfo(torch.float32).min
    want = torch.triu(torch.full((5, 5), lo), diagonal=1)
    assert m.shape == (4, 1, 5, 5) and torch.equal(m[2, 0], want)
    bf = one("attn_mask", ["s", "s"], "bfloat16", s=4)
    assert bf[0, 3] == torch.finfo(torch.bfloat16).min and torch.isfinite(bf).all()
    rect = one("attention_mask", ["n", "q", "k"], q=2, k=5)  # bottom-right aligned
    assert (rect[0, 0, :4] == 0).all() and rect[0, 0, 4] == lo and (rect[0, 1] == 0).all()
    pad = one("attention_mask", ["n", "d"])  # 2-D padding mask, not square by axis
    assert set(pad.unique().tolist()) == {0.0, 1.0}
    b = one("dropout_mask", ["n", "d"], "bool")
    assert b.dtype == torch.bool
    assert set(one("expert_mask", ["n", "d"], "int64").unique().tolist()) <= {0, 1}
    tokens = one("mask_tokens_out", ["n", "q", "k"], q=2, k=5)  # tokens, not a mask
    assert tokens.min() < -0.5 and tokens.max() > 0.5 and tokens.min() > -100


def test_cos_sin_softmax_positive() -> None:
    c, s = one("cos", ["n", "d"]), one("sin", ["n", "d"])
    assert c.abs().max() <= 1 and s.abs().max() <= 1 and c.min() < 0.9
    p = one("attn_weights", ["n", "d"])
    assert torch.allclose(p.sum(-1), torch.ones(4)) and p.min() > 0
    assert torch.allclose(one("router_probs", ["n", "d"]).sum(-1), torch.ones(4))
    for name in ("q_rstd", "x_var", "std", "hidden_states_scale", "weight_scales"):
        assert one(name, ["n", "d"]).min() >= 0.1, name


def test_ssm_decay_ranges() -> None:
    assert (one("A_log", ["d"]) >= 0).all() and (one("A_log", ["d"]) <= math.log(16)).all()
    g = one("g", ["n", "d"])
    assert (g <= 0).all() and (g >= -1).all()
    cs = one("A_cumsum", ["n", "d"])
    assert (cs.diff(dim=-1) <= 0).all() and (cs[:, 0] > -1).all()
    dt = one("dt", ["n", "d"])
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    beta = one("beta", ["n", "d"])
    assert (beta > 0).all() and (beta < 1).all()
    ssm = make_def({n: (["n", "d"], "float32") for n in ("x", "A", "B", "C", "D")})
    got = gen(ssm).values
    assert (got["A"] <= -1).all() and (got["A"] >= -16).all()
    assert got["B"].min() < 0 < got["B"].max()  # B, C, D stay randn
    gemm = gen(make_def({"A": (["n", "d"], "float16"), "B": (["d", "d"], "float16")}))
    assert gemm.values["A"].min() < 0 < gemm.values["A"].max()  # a GEMM's A is randn
    assert not any(n.startswith("A:") for n in gemm.notes)


def test_weight_matrices_scale_by_fan_in() -> None:
    w = one("q_proj_weight", ["k", "m"], k=256, m=1024)
    assert abs(w.std().item() * math.sqrt(1024) - 1) < 0.05
    e = one("expert_gate_proj", ["e", "k", "m"], e=2, k=64, m=256)
    assert abs(e.std().item() * 16 - 1) < 0.1
    conv = one("conv1_weight", ["o", "i", "r", "r"], o=64, i=16, r=4)  # fan_in 16*4*4
    assert abs(conv.std().item() * 16 - 1) < 0.1
    plain = one("hidden_states", ["k", "m"], k=256, m=1024)
    assert abs(plain.std().item() - 1) < 0.05
    bias = one("fc1_bias", ["m"], m=4096)
    assert abs(bias.std().item() - 1) < 0.1


def test_fp8_and_fp4() -> None:
    x = one("hidden_states", ["n", "m"], "float8_e4m3fn", m=512)
    assert x.dtype == torch.float8_e4m3fn and x.float().abs().max() <= 2
    assert x.float().abs().max() > 1.5
    w = one("gemm1_weights", ["n", "m"], "float8_e5m2", m=256)
    assert w.dtype == torch.float8_e5m2 and w.float().std() < 0.2  # scaled by 1/sqrt(256)
    q = one("weight_fp4", ["n", "m"], "float4_e2m1fn_x2", m=64)
    assert q.dtype == torch.float4_e2m1fn_x2 and q.shape == (4, 64)
    vals = lowbit.fp4x2_to_float(q)
    assert vals.shape == (4, 128)
    allowed = set(lowbit.E2M1_VALUES) | {-v for v in lowbit.E2M1_VALUES}
    assert set(vals.unique().tolist()) <= allowed
    assert len(set(vals.unique().tolist())) >= 8  # unit-scale weights: not all rounded to 0
    u = one("codes", ["n"], "float4_e2m1")
    assert u.dtype == torch.uint8 and (u < 16).all()


# ---------------------------------------------------------------- integers


def test_integer_ranges_by_dtype() -> None:
    i8 = one("x", ["n", "m"], "int8", m=512)
    assert i8.dtype == torch.int8 and i8.min() < -100 and i8.max() > 100
    u8 = one("x", ["n", "m"], "uint8", m=512)
    assert u8.dtype == torch.uint8 and u8.max() > 200
    i32 = one("x", ["n", "m"], "int32", m=512)
    assert i32.min() >= -1024 and i32.max() < 1024 and i32.min() < -900
    flag = one("flag", ["n", "m"], "bool", m=64)
    assert flag.dtype == torch.bool and 0 < flag.sum() < flag.numel()
    counts = one("tokens_per_expert", ["m"], "int32", m=64)
    assert counts.min() >= 0


def test_index_inputs_are_bounded_by_axes() -> None:
    consts = {"k": 4, "num_experts": 6, "vocab_size": 50, "seq_len": 9, "num_pages": 3}
    ax: dict[str, Any] = {"n": {"type": "var"}}
    ax.update({k: {"type": "const", "value": v} for k, v in consts.items()})
    defn = make_def(
        {
            "topk_idx": (["n", "k"], "int64"),
            "input_ids": (["n", "seq_len"], "int64"),
            "position_ids": (["n", "seq_len"], "int64"),
            "kv_indices": (["n"], "int32"),
            "gather_index": (["n"], "int64"),
        },
        ax,
    )
    got = gen(defn, make_wl({"n": 32}))
    v = got.values
    assert v["topk_idx"].max() < 6 and v["topk_idx"].min() >= 0
    assert all(len(set(row.tolist())) == 4 for row in v["topk_idx"])  # distinct per row
    assert v["input_ids"].max() < 50 and v["input_ids"].max() >= 25
    assert v["position_ids"].max() < 9 and v["position_ids"].min() >= 0
    assert v["kv_indices"].max() < 3 and v["kv_indices"].dtype == torch.int32
    assert v["gather_index"].max() < 1024 and v["gather_index"].min() >= 0
    assert any("gather_index" in n and "guessed" in n for n in got.notes)
    assert any("topk_idx" in n and "num_experts" in n for n in got.notes)


def test_indptr_offsets_end_at_the_total_axis() -> None:
    ax = {"len_indptr": {"type": "var"}, "total_q": {"type": "var"}}
    defn = make_def(
        {"qo_indptr": (["len_indptr"], "int32"), "cu_seqlens": (["len_indptr"], "int64")}, ax
    )
    got = gen(defn, make_wl({"len_indptr": 5, "total_q": 37})).values
    qo = got["qo_indptr"]
    assert qo.dtype == torch.int32 and qo[0] == 0 and qo[-1] == 37 and (qo.diff() >= 0).all()
    cu = got["cu_seqlens"]  # no kv/qo prefix: a generic "total" axis is used
    assert cu[0] == 0 and cu[-1] == 37 and (cu.diff() >= 0).all()


# ---------------------------------------------------------------- scalars


def test_scalar_inputs_are_cast_to_the_declared_kind() -> None:
    defn = make_def(
        {
            "x": (["n"], "float32"),
            "eps": (None, "float32"),
            "k": (None, "int32"),
            "flag": (None, "bool"),
            "t": ([], "float16"),
        }  # fmt: skip
    )
    wl = make_wl(
        eps={"type": "scalar", "value": 1}, k={"type": "scalar", "value": 3.0},
        flag={"type": "scalar", "value": 1}, t={"type": "scalar", "value": 2.5},
    )  # fmt: skip
    v = gen(defn, wl).values
    assert v["eps"] == 1.0 and type(v["eps"]) is float
    assert v["k"] == 3 and type(v["k"]) is int
    assert v["flag"] is True
    assert v["t"].shape == () and v["t"].dtype == torch.float16 and v["t"].item() == 2.5
    with pytest.raises(InputGenerationError, match=r"'k'.*not an integer"):
        gen(defn, make_wl(k={"type": "scalar", "value": 2.5}))


def test_random_scalars() -> None:
    defn = make_def({"x": (["n"], "float32"), "p": (None, "float32"), "i": (None, "int64"),
                     "b": (None, "bool")})  # fmt: skip
    seen = [gen(defn, seed=s).values for s in range(20)]
    assert all(type(v["p"]) is float and 0 <= v["p"] < 1 for v in seen)
    assert all(type(v["i"]) is int and -1024 <= v["i"] < 1024 for v in seen)
    assert {v["b"] for v in seen} == {True, False}


# ---------------------------------------------------------------- custom entrypoint

CUSTOM_SRC = """
CALLS = []

def get_inputs(axes_and_scalars, device):
    CALLS.append(dict(axes_and_scalars))
    n = axes_and_scalars["n"]
    out = {"x": torch.randn(n, axes_and_scalars["d"], device=device),
           "idx": torch.arange(n, device=device), "unused": 1}
    if axes_and_scalars.get("drop"):
        del out["idx"]
    if axes_and_scalars.get("fail"):
        raise RuntimeError("custom generator exploded")
    return out
"""


def custom_def() -> Definition:
    return make_def(
        {"x": (["n", "d"], "float32"), "idx": (["n"], "int64")},
        extra_source=CUSTOM_SRC,
        entrypoint="get_inputs",
    )


def custom_wl(**axes: int) -> Workload:
    return make_wl({"n": 3, **axes}, x={"type": "custom"}, idx={"type": "custom"})


def test_custom_entrypoint_gets_axes_and_is_seeded() -> None:
    defn = custom_def()
    module = load_reference_module(defn)
    a = gen(defn, custom_wl(), seed=5, reference_module=module)
    b = gen(defn, custom_wl(), seed=5)  # loads its own module
    assert list(a.values) == ["x", "idx"]
    assert torch.equal(a.values["x"], b.values["x"]) and a.values["x"].shape == (3, 8)
    assert module.CALLS == [{"n": 3, "d": 8}]
    assert any("unused" in n for n in a.notes)


def test_custom_entrypoint_errors() -> None:
    defn = custom_def()
    with pytest.raises(InputGenerationError, match=r"did not return inputs \['idx'\]"):
        gen(defn, custom_wl(drop=1))
    with pytest.raises(InputGenerationError) as e:
        gen(defn, custom_wl(fail=1))
    assert "custom generator exploded" in str(e.value) and "<reference:toy>" in str(e.value)


# ---------------------------------------------------------------- safetensors


def blob_setup(tmp_path: Path, tensor: torch.Tensor, key: str = "kv_indptr") -> Workload:
    from safetensors.torch import save_file

    (tmp_path / "blobs").mkdir()
    save_file({key: tensor, "other": torch.zeros(2)}, str(tmp_path / "blobs" / "w.safetensors"))
    src = {"type": "safetensors", "path": "blobs/w.safetensors", "tensor_key": "kv_indptr"}
    return make_wl({"n": 4}, kv_indptr=src)


def test_safetensors_round_trip(tmp_path: Path) -> None:
    defn = make_def({"x": (["n", "d"], "bfloat16"), "kv_indptr": (["n"], "int32")})
    stored = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    got = gen(defn, blob_setup(tmp_path, stored), root=tmp_path)
    assert torch.equal(got.values["kv_indptr"], stored)
    assert got.values["x"].dtype == torch.bfloat16


def test_safetensors_mismatches(tmp_path: Path) -> None:
    defn = make_def({"x": (["n", "d"], "bfloat16"), "kv_indptr": (["n"], "int32")})
    wl = blob_setup(tmp_path, torch.zeros(5, dtype=torch.int64))
    with pytest.raises(InputGenerationError, match=r"torch.int64 \[5\].*int32 \[4\]"):
        gen(defn, wl, root=tmp_path)
    wl2 = wl.model_copy(
        update={
            "inputs": {"kv_indptr": SafetensorsInput(path="blobs/w.safetensors", tensor_key="nope")}
        }
    )
    with pytest.raises(InputGenerationError, match=r"no tensor 'nope'.*'kv_indptr', 'other'"):
        gen(defn, wl2, root=tmp_path)


def test_missing_blob_error_names_file_input_and_remedy(tmp_path: Path) -> None:
    defn = make_def({"x": (["n", "d"], "bfloat16"), "kv_indptr": (["n"], "int32")})
    src = {"type": "safetensors", "path": "data/flashinfer-trace/a.safetensors", "tensor_key": "k"}
    wl = make_wl({"n": 4}, kv_indptr=src)
    for root in (tmp_path, None):
        with pytest.raises(MissingBlobError) as e:
            gen(defn, wl, root=root)
        msg = str(e.value)
        assert "data/flashinfer-trace/a.safetensors" in msg and "'kv_indptr'" in msg
        assert "flashinfer-trace blobs" in msg and "generator" in msg and "toy workload w0" in msg


def test_estimate_input_bytes() -> None:
    defn = make_def({"x": (["n", "d"], "bfloat16"), "q": (["n", "d"], "float4_e2m1fn_x2"),
                     "s": (None, "float32")})  # fmt: skip
    assert estimate_input_bytes(defn, make_wl({"n": 4})) == 4 * 8 * 2 + 4 * 8


# ---------------------------------------------------------------- FP4 packing


def test_e2m1_rounding_and_packing_round_trip() -> None:
    x = torch.tensor([0.0, 0.2, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 100.0,
                      -0.5, -1.6, -7.0, -0.1])  # fmt: skip
    want = [0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0,
            -0.5, -1.5, -6.0, -0.0]  # fmt: skip
    codes = lowbit.quantize_e2m1(x)
    assert lowbit.dequantize_e2m1(codes).tolist() == want
    assert codes[-1] == 8  # negative zero keeps its sign bit
    packed = lowbit.pack_fp4x2(codes)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (8,)
    raw = packed.view(torch.uint8)
    assert raw[1] == codes[2] | (codes[3] << 4)  # low nibble first
    assert torch.equal(lowbit.unpack_fp4x2(packed), codes)
    every = torch.tensor([v for v in lowbit.E2M1_VALUES] + [-v for v in lowbit.E2M1_VALUES])
    assert torch.equal(lowbit.fp4x2_to_float(lowbit.fp4x2_from_float(every)), every)
    with pytest.raises(lowbit.LowBitError):
        lowbit.pack_fp4x2(codes[:3])
    with pytest.raises(lowbit.LowBitError):
        lowbit.quantize_e2m1(torch.tensor([float("nan")]))


# ---------------------------------------------------------------- sweep over real problems

SWEEP_BYTES = 256 * 10**6
SWEEP_BUDGET_S = 40.0
#: Conservative CPU throughputs used to skip a problem that would overrun the budget: the
#: custom generators of FP4 problems run their reference quantizers, which are slow on CPU.
SLOW_MB_PER_S, FAST_MB_PER_S = 2.5, 100.0


def _smallest_workload(defn: Definition, workloads: list[Workload]) -> Workload:
    def elements(w: Workload) -> int:
        env_ = resolve_axes(defn, w)
        shapes = (resolve_shape(s.shape, env_) for s in defn.inputs.values())
        return sum(math.prod(s) for s in shapes if s is not None)

    return min(workloads, key=elements)


def _check_generated(defn: Definition, wl: Workload, got: GeneratedInputs) -> None:
    assert list(got.values) == list(defn.inputs), defn.name
    env_ = resolve_axes(defn, wl)
    for name, spec in defn.inputs.items():
        value, shape = got.values[name], resolve_shape(spec.shape, env_)
        if not isinstance(value, torch.Tensor) or wl.is_custom:
            continue  # custom values are the reference's own (some masks hold -inf)
        assert tuple(value.shape) == shape, f"{defn.name}: {name}"
        assert value.dtype == torch_dtype(spec.dtype), f"{defn.name}: {name}"
        if value.is_floating_point() and value.element_size() > 1:
            assert torch.isfinite(value.float()).all(), f"{defn.name}: {name} not finite"


def test_sweep_shared_problems() -> None:
    """Smallest workload of every shared problem, on the CPU: absent blobs get generated
    stand-ins (noted); > 256 MB of inputs is skipped; the rest generate within a budget."""
    root = shared_problems_root()
    todo = []
    for path in sorted(root.glob("*/*/definition.json")):
        defn = Definition.model_validate_json(path.read_text())
        lines = (path.parent / "workload.jsonl").read_text().splitlines()
        wl = _smallest_workload(defn, [Workload.model_validate_json(x) for x in lines if x.strip()])
        fp4 = any(s.dtype in lowbit.FP4_DTYPES for s in defn.inputs.values())
        slow = wl.is_custom and fp4
        todo.append((slow, wl.is_custom, estimate_input_bytes(defn, wl), path.parent, defn, wl))
    assert todo, f"no problems under {root}"
    todo.sort(key=lambda t: t[:3])  # fast and small first
    counts = {"generated": 0, "too_big": 0, "out_of_time": 0}
    stand_ins = 0
    start = time.monotonic()
    for slow, _, nbytes, pdir, defn, wl in todo:
        blobs = [s for s in wl.inputs.values() if isinstance(s, SafetensorsInput)]
        absent = any(not (pdir / s.path).is_file() for s in blobs)
        if nbytes > SWEEP_BYTES:
            counts["too_big"] += 1
            continue
        predicted = nbytes / 1e6 / (SLOW_MB_PER_S if slow else FAST_MB_PER_S)
        if time.monotonic() - start + predicted > SWEEP_BUDGET_S:
            counts["out_of_time"] += 1
            continue
        got = generate_inputs(defn, wl, device="cpu", seed=0, problem_root=pdir)
        _check_generated(defn, wl, got)
        counts["generated"] += 1
        if absent:
            assert any(n.startswith("generated inputs") for n in got.notes), defn.name
            stand_ins += 1
    elapsed = time.monotonic() - start
    print(f"\ninputs sweep over {len(todo)} problems: {counts} in {elapsed:.1f}s")
    print(f"{stand_ins} of them with generated stand-ins for missing blobs")
    assert sum(counts.values()) == len(todo)
    assert counts["generated"] > 0
