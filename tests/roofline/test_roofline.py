"""Tests of kernelarc.roofline: exact flop/byte counts on handmade definitions, the score
formula's edge cases, profile lookup, the ``kernelarc sol`` command, and agreement with the
published B200 bounds of two real problems (skipped without the shared problem tree)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kernelarc import env
from kernelarc.errors import KernelArcError
from kernelarc.problem.schema import Definition, Workload
from kernelarc.roofline.flops import WorkloadCost, count_workload
from kernelarc.roofline.profiles import (
    B200,
    DTYPE_CLASSES,
    H200,
    DeviceProfile,
    UnknownDeviceError,
    cpu_profile,
    cpu_profile_path,
    get_profile,
    profile_for_gpu_name,
)
from kernelarc.roofline.score import fraction_of_bound, sol_score, t_sol_ms


def make_definition(
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    reference: str,
    axes: dict[str, Any] | None = None,
) -> Definition:
    return Definition.model_validate(
        {
            "name": "handmade",
            "axes": axes
            if axes is not None
            else {
                "M": {"type": "var"},
                "N": {"type": "const", "value": 48},
                "K": {"type": "const", "value": 40},
            },
            "inputs": inputs,
            "outputs": outputs,
            "reference": reference,
        }
    )


def workload(**axes: int) -> Workload:
    return Workload.model_validate({"uuid": "w-" + "-".join(map(str, axes.values())), "axes": axes})


def gemm(dtype: str) -> Definition:
    return make_definition(
        {"A": {"shape": ["M", "K"], "dtype": dtype}, "B": {"shape": ["N", "K"], "dtype": dtype}},
        {"C": {"shape": ["M", "N"], "dtype": dtype}},
        "import torch\n\ndef run(A, B):\n    return torch.matmul(A, B.T)\n",
    )


# ---------------------------------------------------------------- counting


@pytest.mark.parametrize(
    ("dtype", "cls", "size"),
    [("float16", "bf16", 2), ("bfloat16", "bf16", 2), ("float32", "fp32", 4)],
)
def test_gemm_flops_and_bytes_are_exact(dtype: str, cls: str, size: int) -> None:
    m, n, k = 7, 48, 40
    cost = count_workload(gemm(dtype), workload(M=m))
    assert cost.method == "meta"
    assert cost.flops_by_class == {cls: 2 * m * n * k}
    assert cost.flops == 2 * m * n * k
    assert cost.input_bytes == (m * k + n * k) * size
    assert cost.output_bytes == m * n * size
    assert cost.bytes == (m * k + n * k + m * n) * size
    assert cost.bytes_by_tensor == {
        "in:A": m * k * size,
        "in:B": n * k * size,
        "out:C": m * n * size,
    }


def test_real_shapes_cost_nothing_on_meta() -> None:
    m = 1 << 20  # a 40 GiB problem in fp32: never allocated
    cost = count_workload(gemm("float32"), workload(M=m))
    assert cost.flops_by_class == {"fp32": 2 * m * 48 * 40}


def test_linear_with_bias_and_elementwise_ops_count_only_the_matmul() -> None:
    d = make_definition(
        {
            "x": {"shape": ["M", "K"], "dtype": "bfloat16"},
            "w": {"shape": ["N", "K"], "dtype": "bfloat16"},
            "b": {"shape": ["N"], "dtype": "bfloat16"},
            "eps": {"shape": None, "dtype": "float32"},
        },
        {"y": {"shape": ["M", "N"], "dtype": "bfloat16"}},
        "import torch\nimport torch.nn.functional as F\n\n"
        "def run(x, w, b, eps):\n"
        "    h = F.linear(x, w, b)\n"
        "    return torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + eps).to(h.dtype) * h\n",
    )
    cost = count_workload(d, workload(M=5))
    assert cost.flops_by_class == {"bf16": 2 * 5 * 48 * 40}
    assert [(o.op, o.calls) for o in cost.ops] == [("addmm", 1)]
    assert cost.bytes == (5 * 40 + 48 * 40 + 48 + 5 * 48) * 2  # the scalar eps moves 0 bytes


def test_packed_fp4_matmul_counts_logical_k() -> None:
    d = make_definition(
        {
            "a": {"shape": ["M", "Kh"], "dtype": "float4_e2m1fn_x2"},
            "b": {"shape": ["N", "Kh"], "dtype": "float4_e2m1fn_x2"},
            "sa": {"shape": ["S"], "dtype": "float8_e4m3fn"},
            "sb": {"shape": ["S"], "dtype": "float8_e4m3fn"},
        },
        {"c": {"shape": ["M", "N"], "dtype": "bfloat16"}},
        "import torch\n\ndef run(a, b, sa, sb):\n"
        "    return torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)\n",
        axes={
            "M": {"type": "const", "value": 128},
            "N": {"type": "const", "value": 128},
            "Kh": {"type": "const", "value": 32},
            "S": {"type": "const", "value": 512},
        },
    )
    cost = count_workload(d, workload())
    assert cost.flops_by_class == {"fp4": 2 * 128 * 128 * 64}  # K = 2 x 32 packed
    assert cost.input_bytes == 2 * 128 * 32 + 2 * 512  # one byte per packed element


def test_reference_that_hard_codes_cuda_is_counted_on_meta() -> None:
    d = make_definition(
        {"x": {"shape": ["M", "K"], "dtype": "float32"}},
        {"y": {"shape": ["M", "N"], "dtype": "float32"}},
        "import torch\n\ndef run(x):\n"
        "    w = torch.ones(48, 40, device='cuda')\n"
        "    return x @ w.to('cuda').T\n",
    )
    cost = count_workload(d, workload(M=3))
    assert cost.method == "meta"
    assert cost.flops_by_class == {"fp32": 2 * 3 * 48 * 40}


DATA_DEPENDENT = (
    "import torch\n\ndef run(x, w):\n"
    "    rows = torch.nonzero(x[:, 0] > -1e30).squeeze(1)\n"
    "    return x[rows] @ w.T\n"
)


def data_dependent() -> Definition:
    return make_definition(
        {
            "x": {"shape": ["M", "K"], "dtype": "float32"},
            "w": {"shape": ["N", "K"], "dtype": "float32"},
        },
        {"y": {"shape": ["M", "N"], "dtype": "float32"}},
        DATA_DEPENDENT,
    )


def test_data_dependent_reference_falls_back_to_cpu_when_small() -> None:
    cost = count_workload(data_dependent(), workload(M=6))
    assert cost.method == "cpu"
    assert cost.flops_by_class == {"fp32": 2 * 6 * 48 * 40}  # every row is selected
    assert any("meta: " in n for n in cost.notes)


def test_data_dependent_reference_too_large_for_cpu_has_a_reason() -> None:
    cost = count_workload(data_dependent(), workload(M=6), cpu_limit_bytes=0)
    assert cost.flops_by_class is None and cost.flops is None
    assert cost.method == "none"
    assert cost.reason is not None
    assert "handmade" in cost.reason and "w-6" in cost.reason and "nonzero" in cost.reason
    assert cost.bytes == (6 * 40 + 48 * 40 + 6 * 48) * 4  # bytes are known regardless
    with pytest.raises(KernelArcError, match="nonzero"):
        t_sol_ms(cost, B200)


def test_bounds_on_cuda_recount_what_meta_and_cpu_cannot_on_the_gpu() -> None:
    """The survey and the CLIs ask ``workload_bounds`` for a CUDA device: a reference that
    cannot be counted on meta tensors and is too big for the CPU is counted on the GPU."""
    import torch

    from kernelarc.roofline.bounds import workload_bounds

    big = workload(M=600_000)  # x alone: 96 MB, more than the CPU count's 64 MiB limit
    bounds, warnings = workload_bounds(data_dependent(), [big], "cpu")
    assert bounds == {} and "; cuda: " not in warnings[0] and "nonzero" in warnings[0]
    bounds, warnings = workload_bounds(data_dependent(), [big], "cuda", "H200")
    if torch.cuda.is_available():
        assert warnings == [] and bounds[big.uuid] > 0
    else:  # the GPU count was attempted, and its failure is part of the warning
        assert bounds == {} and "nonzero" in warnings[0] and "; cuda: " in warnings[0]
        assert "--count-on cuda" not in warnings[0]  # no advice to try what was tried


def test_a_count_in_a_child_process_equals_the_count_here_and_raises_its_failures() -> None:
    """GPU counts run in a spawned child (its memory goes back when it exits); on the CPU
    the same helper must give what the in-process count gives, notes included."""
    from kernelarc.problem.axes import resolve_axes
    from kernelarc.roofline.flops import run_counted_in_child

    d, wl = data_dependent(), workload(M=6)
    by_class, ops, notes = run_counted_in_child(d, wl, resolve_axes(d, wl), "cpu")
    here = count_workload(d, wl, device="cpu")
    assert by_class == here.flops_by_class == {"fp32": 2 * 6 * 48 * 40}
    assert ops == here.ops and notes == []
    with pytest.raises(Exception, match="nonzero"):  # meta cannot run the reference
        run_counted_in_child(d, wl, resolve_axes(d, wl), "meta")


def test_item_reads_on_meta_use_placeholders_and_say_so() -> None:
    d = make_definition(
        {
            "x": {"shape": ["M", "K"], "dtype": "bfloat16"},
            "w": {"shape": ["N", "K"], "dtype": "bfloat16"},
        },
        {"y": {"shape": ["M", "N"], "dtype": "bfloat16"}},
        "import torch\n\ndef run(x, w):\n    s = x.abs().max().item()\n    return (x / s) @ w.T\n",
    )
    cost = count_workload(d, workload(M=4), cpu_limit_bytes=0)
    assert cost.method == "meta-placeholders"
    assert cost.flops_by_class == {"bf16": 2 * 4 * 48 * 40}
    assert any("placeholder" in n for n in cost.notes)


# ---------------------------------------------------------------- score


def profile(**overrides: Any) -> DeviceProfile:
    base: dict[str, Any] = {
        "name": "toy",
        "peak_flops": {
            "fp64": 1e9,
            "fp32": 2e9,
            "tf32": 4e9,
            "bf16": 8e9,
            "fp8": 16e9,
            "fp4": None,
        },
        "emulated_as": {"fp4": "bf16"},
        "dram_bandwidth": 1e9,
        "l2_bytes": 0,
        "fixed_latency_s": 1e-3,
    }
    base.update(overrides)
    return DeviceProfile.model_validate(base)


def cost(flops: dict[str, float], nbytes: int) -> WorkloadCost:
    return WorkloadCost(
        definition="d",
        workload="w",
        axes={},
        flops_by_class=flops,
        bytes=nbytes,
        input_bytes=nbytes,
        output_bytes=0,
        method="meta",
    )


def test_t_sol_is_the_max_of_compute_and_memory() -> None:
    p = profile()
    # strict: 8e9 bf16 flops / 8e9 = 1 s + 16e9 fp8 / 16e9 = 1 s -> 2 s compute; 1 s memory
    ms, bound = t_sol_ms(cost({"bf16": 8e9, "fp8": 16e9}, 10**9), p, convention="strict")
    assert (ms, bound) == (pytest.approx(2000.0), "compute")
    ms, bound = t_sol_ms(cost({"bf16": 8e9}, 3 * 10**9), p, convention="strict")
    assert (ms, bound) == (pytest.approx(3000.0), "memory")
    ms, bound = t_sol_ms(cost({}, 10**9), p, convention="strict")
    assert (ms, bound) == (pytest.approx(1000.0), "memory")


def test_conventions_differ_only_in_fp32_rate_and_latency() -> None:
    p = profile()
    c = cost({"fp32": 8e9, "tf32": 8e9, "fp64": 1e9}, 0)
    assert t_sol_ms(c, p, convention="strict")[0] == pytest.approx((4 + 2 + 1) * 1e3)
    assert t_sol_ms(c, p, convention="solar")[0] == pytest.approx((1 + 1 + 1) * 1e3 + 1.0)
    assert t_sol_ms(cost({"fp4": 8e9}, 0), p, convention="strict")[0] == pytest.approx(1e3)
    with pytest.raises(ValueError, match="convention"):
        t_sol_ms(c, p, convention="bogus")  # type: ignore[arg-type]


def test_sol_score_edge_cases() -> None:
    assert sol_score(2.0, 1.0, 2.0) == 0.5  # at the baseline
    assert sol_score(1.0, 1.0, 2.0) == 1.0  # at the bound
    assert sol_score(3.0, 1.0, 2.0) == pytest.approx(1 / 3)
    assert sol_score(0.5, 1.0, 2.0) == pytest.approx(2.0)  # faster than the bound: not clipped
    assert sol_score(1.0, 1.0, 1.0) == 1.0  # T_b <= T_sol: 1 at or below the bound
    assert sol_score(0.9, 1.0, 0.5) == 1.0
    assert sol_score(1.1, 1.0, 0.5) == 0.0  # ... else 0
    for bad in ((-1.0, 1.0, 2.0), (1.0, math.nan, 2.0), (1.0, 1.0, math.inf)):
        with pytest.raises(ValueError):
            sol_score(*bad)


def test_fraction_of_bound() -> None:
    assert fraction_of_bound(4.0, 1.0) == 0.25
    assert fraction_of_bound(1.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        fraction_of_bound(0.0, 1.0)
    with pytest.raises(ValueError):
        fraction_of_bound(1.0, -1.0)


# ---------------------------------------------------------------- profiles


def test_builtin_constants() -> None:
    assert B200.peak_flops["bf16"] == 1.5e9 * 603_751 * 2
    assert B200.rate("fp8") == 2 * B200.rate("bf16") and B200.rate("fp4") == 4 * B200.rate("bf16")
    assert B200.rate("tf32") == B200.rate("bf16") / 2
    assert B200.dram_bandwidth == 7.67e12
    assert H200.peak_flops["bf16"] == 787e12 and H200.dram_bandwidth == 4.27e12
    assert H200.peak_flops["fp4"] is None and H200.rate("fp4") == H200.rate("bf16")
    assert H200.datasheet["dram_bandwidth"] == 4.8e12
    for p in (B200, H200, get_profile("h100")):
        assert set(DTYPE_CLASSES) <= set(p.peak_flops)
        assert p.rate("fp32") < p.rate("tf32") < p.rate("bf16") < p.rate("fp8")


@pytest.mark.parametrize("name", ["h200", "H200", " H200 "])
def test_get_profile_is_case_insensitive(name: str) -> None:
    assert get_profile(name) is H200


def test_profile_lookup_errors_list_the_choices() -> None:
    with pytest.raises(UnknownDeviceError, match=r"'a100'.*b200, h100, h200, cpu, local-cuda"):
        get_profile("a100")
    assert profile_for_gpu_name("NVIDIA H200").name == "H200"
    assert profile_for_gpu_name("NVIDIA B200").name == "B200"
    with pytest.raises(UnknownDeviceError, match="NVIDIA A100"):
        profile_for_gpu_name("NVIDIA A100-SXM4-80GB")


def test_local_cuda_without_a_gpu_is_an_error() -> None:
    import torch

    if torch.cuda.is_available():
        assert get_profile("local-cuda").name in ("B200", "H100", "H200")
    else:
        with pytest.raises(UnknownDeviceError, match="needs a visible CUDA device"):
            get_profile("local-cuda")


def test_invalid_profiles_are_rejected() -> None:
    with pytest.raises(ValueError, match="lacks classes"):
        profile(peak_flops={"bf16": 1e9})
    with pytest.raises(ValueError, match="emulated_as"):
        profile(emulated_as={})


def test_cpu_profile_is_measured_once_and_cached(tmp_path: Path) -> None:
    first = cpu_profile(cache=tmp_path)
    path = cpu_profile_path(tmp_path)
    assert path.is_file() and path.parent == tmp_path / "profiles"
    assert first.rate("fp32") > 0 and first.dram_bandwidth > 0
    assert cpu_profile(cache=tmp_path) == first  # read back, not re-measured
    path.write_text("{not json")
    with pytest.raises(KernelArcError, match="delete it"):
        cpu_profile(cache=tmp_path)


# ---------------------------------------------------------------- the sol command


def write_problem(root: Path, definition: Definition, workloads: list[Workload]) -> Path:
    root.mkdir()
    (root / "definition.json").write_text(definition.model_dump_json())
    (root / "workload.jsonl").write_text(
        "".join(w.model_dump_json(exclude={"tolerance"}) + "\n" for w in workloads)
    )
    return root


def test_sol_command_json(tmp_path: Path) -> None:
    from kernelarc.cli.main import app

    problem = write_problem(tmp_path / "p", gemm("bfloat16"), [workload(M=8), workload(M=4096)])
    result = CliRunner().invoke(app, ["sol", str(problem), "--device", "B200", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["flops"] for r in rows] == [2 * 8 * 48 * 40, 2 * 4096 * 48 * 40]
    assert [r["bound"] for r in rows] == ["memory", "memory"]
    expected = ((8 * 40 + 48 * 40 + 8 * 48) * 2 / B200.dram_bandwidth + 0.4e-6) * 1e3
    assert rows[0]["t_sol_ms"] == pytest.approx(expected)
    one = CliRunner().invoke(app, ["sol", str(problem), "-w", "1", "--json"])
    assert [r["index"] for r in json.loads(one.stdout)] == [1]


def test_sol_command_usage_errors(tmp_path: Path) -> None:
    from kernelarc.cli.main import app

    problem = write_problem(tmp_path / "p", gemm("float16"), [workload(M=8)])
    bad = CliRunner().invoke(app, ["sol", str(problem), "--device", "a100"])
    assert bad.exit_code == 2 and "choose one of" in bad.output
    missing = CliRunner().invoke(app, ["sol", str(tmp_path / "absent")])
    assert missing.exit_code == 2


# ---------------------------------------------------------------- agreement with SOLAR


def shared_problem(subset: str, name: str) -> Path:
    root = (
        env.shared_problems() or Path(__file__).resolve().parents[2] / ".." / "shared" / "problems"
    )
    path = root / subset / name
    if not (path / "metadata.json").is_file():
        pytest.skip(f"no shared problem {subset}/{name} at {root}")
    return path


@pytest.mark.parametrize("name", ["007_gemm_n4096_k4096", "025_rmsnorm_h4096"])
def test_b200_bound_agrees_with_published_sol(name: str) -> None:
    path = shared_problem("FlashInfer-Bench", name)
    definition = Definition.model_validate_json((path / "definition.json").read_text())
    lines = (path / "workload.jsonl").read_text().splitlines()
    workloads = [Workload.model_validate_json(line) for line in lines if line.strip()]
    published = json.loads((path / "metadata.json").read_text())["sol"]["per_workload"]
    assert len(published) == len(workloads)
    for w, entry in zip(workloads, published, strict=True):
        ours, _ = t_sol_ms(count_workload(definition, w), B200)
        # within 10%, plus the 0.05 us rounding of the published value
        assert abs(ours - entry["sol_ms"]) <= 0.1 * entry["sol_ms"] + 5e-5, (w.axes, ours)


def test_counting_on_cpu_leaves_the_global_rng_alone() -> None:
    import torch

    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    cost = count_workload(data_dependent(), workload(M=6))  # a real CPU run, seeded inside
    assert cost.method == "cpu"
    assert torch.equal(torch.rand(3), expected)
