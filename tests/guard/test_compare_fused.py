"""The fused comparison kernel (``guard/compare_fused.py``) against the torch paths.

On the CPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported, so in a subprocess): that checks its logic (masks, blocks, the
element rules, the reduction of the partial rows), not the GPU's rounding. The CUDA test
checks the rounding on the device: the same matched counts and maxima as the torch fast
path, bit for bit, on data built to sit on the threshold. Skipped without CUDA.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelarc.guard.compare as cmp
from kernelarc.problem.schema import Tolerance

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
TOLS = [
    Tolerance(max_atol=1e-2, max_rtol=1e-2, required_matched_ratio=0.9),
    Tolerance(max_atol=0.0, max_rtol=0.1, required_matched_ratio=0.9),
    Tolerance(max_atol=1e-3, max_rtol=0.0, required_matched_ratio=0.5),
    Tolerance(max_atol=0.0, max_rtol=0.0, required_matched_ratio=0.0),
]
CASES = ["plain", "zeros", "all-zero-output", "tiny", "threshold", "nan", "overflow"]


def pair(case: str, n: int, dtype: torch.dtype = torch.float32,
         device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    g = torch.Generator().manual_seed(n)
    y = torch.randn(n, generator=g) * 3
    x = y + torch.randn(n, generator=g) * 0.03
    if case == "zeros":
        y[::7], x[::5], x[::11] = 0.0, 0.0, y[::11]
    elif case == "all-zero-output":
        x.zero_()
    elif case == "tiny":
        y[::3] = 1e-40
    elif case == "threshold":  # differences at atol + rtol*|y| in float32, give or take an ulp
        lim = y.abs() * 1e-2 + 1e-2
        x = y + lim * torch.tensor([1.0, -1.0])[torch.arange(n) % 2]
        x[::3] = torch.nextafter(x[::3], torch.full_like(x[::3], math.inf))
    elif case == "nan":
        x[n // 2] = math.nan
    elif case == "overflow":
        x[5], y[5] = 3e38, -3e38
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def torch_totals(x: torch.Tensor, y: torch.Tensor, tol: Tolerance) -> dict[str, object]:
    acc = cmp._Acc()
    cmp._chunk_float(x.float(), y.float(), tol, acc)
    return vars(acc)


def fused_totals(x: torch.Tensor, y: torch.Tensor, tol: Tolerance) -> dict[str, object] | None:
    acc = cmp._Acc()
    from kernelarc.guard import compare_fused

    t = compare_fused.fused_totals(x, y, float(tol.max_rtol), float(tol.max_atol))
    if t.nonfinite:
        return None
    acc.add_finite(t)
    return vars(acc)


def same(fused: dict[str, object] | None, ref: dict[str, object], case: str) -> list[str]:
    """What differs: None stands for 'the kernel saw a non-finite difference'."""
    if fused is None:
        return [] if case in ("nan", "overflow") else ["non-finite reported"]
    if case in ("nan", "overflow"):
        return ["non-finite missed"]
    bad = [k for k in ref if k not in ("sq_diff", "sq_ref") and fused[k] != ref[k]]
    bad += [k for k in ("sq_diff", "sq_ref")
            if not math.isclose(fused[k], ref[k], rel_tol=1e-12, abs_tol=1e-300)]  # type: ignore[arg-type]  # fmt: skip
    return [f"{k}: fused {fused[k]!r}, torch {ref[k]!r}" for k in bad]


def _interpreted(n: int) -> list[str]:
    """Run every case and tolerance through the interpreted kernel in a subprocess."""
    # this tree's src first; what the parent's path adds (dependencies) stays after it
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_compare_fused as t; "
        f"print(json.dumps(t.all_differences({n}, 'cpu')))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def all_differences(n: int, device: str) -> list[str]:
    out = []
    for case in CASES:
        for i, tol in enumerate(TOLS):
            for dtype in (torch.float32, torch.bfloat16):
                x, y = pair(case, n, dtype, device)
                diffs = same(fused_totals(x, y, tol), torch_totals(x, y, tol), case)
                out += [f"{case}/tol{i}/{dtype}: {d}" for d in diffs]
    return out


def test_the_interpreted_kernel_gives_the_torch_paths_totals() -> None:
    # 5000: two full blocks and a partial third; every case and tolerance above
    assert _interpreted(5000) == []


def test_can_fuse_refuses_what_the_kernel_does_not_take() -> None:
    from kernelarc.guard.compare_fused import can_fuse

    x = torch.zeros(8)
    assert not can_fuse(x, x, 0.0)  # CPU tensors: the torch paths
    with pytest.raises(ValueError, match="rounds to 0"):
        from kernelarc.guard.compare_fused import fused_totals as ft

        ft(x, x, 0.1, 1e-50)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5000, (1 << 20) + 17])
def test_on_the_gpu_the_kernel_rounds_as_the_torch_path(n: int) -> None:
    assert all_differences(n, "cuda") == []


@pytest.mark.gpu
def test_check_output_takes_the_fused_path_on_large_cuda_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernelarc.guard import compare_fused

    calls: list[int] = []
    real = compare_fused.fused_totals

    def counted(x: torch.Tensor, *a: float) -> compare_fused.Totals:
        calls.append(x.numel())
        return real(x, *a)

    monkeypatch.setattr(compare_fused, "fused_totals", counted)
    x, y = pair("threshold", cmp.FUSED_MIN_ELEMS + 5, device="cuda")
    tol = TOLS[0]
    fused = cmp.check_output("y", x, y, tol, expected_shape=(x.numel(),),
                             expected_dtype=torch.float32)  # fmt: skip
    monkeypatch.setattr(cmp, "FUSED_MIN_ELEMS", 1 << 62)
    plain = cmp.check_output("y", x, y, tol, expected_shape=(x.numel(),),
                             expected_dtype=torch.float32)  # fmt: skip
    assert calls == [x.numel()]
    assert fused.model_dump(exclude={"rel_l2_error"}) == plain.model_dump(exclude={"rel_l2_error"})
    assert fused.rel_l2_error == pytest.approx(plain.rel_l2_error, rel=1e-12)
