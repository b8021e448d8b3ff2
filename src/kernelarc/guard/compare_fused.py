"""One-pass totals of a float comparison chunk on a CUDA device (a Triton kernel).

:func:`kernelarc.guard.compare._chunk_float` computes its totals with about a dozen torch
passes over the chunk (about 180 bytes of memory traffic per element, docs/PERFORMANCE.md).
:func:`fused_totals` reads each element of the output and the reference once and writes one
row of partial totals per block of :data:`BLOCK` elements; a small torch reduction over the
rows gives the chunk's totals.

The element rules are the torch path's, written to round the same way:

- ``diff = |x - y|`` in float32 (inputs of float16/bfloat16 are widened exactly in
  registers, float32 is read as it is);
- ``limit = (|y| * rtol) + atol``, two float32 roundings with ``rtol`` and ``atol`` rounded to
  float32 first, as torch's tensor-scalar kernels do; the kernel is compiled with
  ``enable_fp_fusion=False`` so that the multiply and the add are not contracted to an FMA
  (which rounds once and would move elements across the threshold);
- ``rel = diff / max(|y|, atol)`` (``/ |y|`` when atol is 0, then 0 where diff is 0) with
  IEEE round-to-nearest division (``div_rn``; Triton's plain ``/`` is approximate);
- the sums of squares in float64.

What agrees with the torch path exactly: the matched count, the maximum absolute and
relative errors, the non-zero flags and the count of non-finite differences (maxima and
counts do not depend on order). What agrees only to rounding: the two float64 sums of
squares (another summation order; relative differences of order 1e-15, far below any
threshold :func:`kernelarc.guard.compare.precision_level` reads).

Not covered here: chunks with a non-finite difference (the caller gives those to the masked
torch path, as the torch fast path does), tolerances whose ``atol`` is positive but
rounds to 0 in float32 (the caller keeps those on the torch path), other dtypes, and CPU
tensors outside Triton's interpreter (the caller uses this only for CUDA tensors; tests run
it under ``TRITON_INTERPRET=1`` on the CPU). The GPU's rounding equality with the torch
path is checked by ``tests/test_compare_fused.py``'s CUDA test, not on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

#: Elements per program; each program writes one row of partial totals.
BLOCK = 2048
#: Dtypes the kernel reads as they are (widened to float32 exactly in registers).
NATIVE_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})


@triton.jit
def _partials(x_ptr, y_ptr, n, rtol, atol, out_f32, out_f64, out_i32,
              ATOL_POSITIVE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    x = tl.load(x_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    diff = tl.abs(x - y)
    ay = tl.abs(y)
    # NaN fails both comparisons; +-inf fails the second: a non-finite difference
    nonfinite = inb & ((diff != diff) | (diff > 3.4028234663852886e38))
    limit = ay * rtol + atol  # no FMA: compiled with enable_fp_fusion=False
    matched = inb & (diff <= limit)
    if ATOL_POSITIVE:
        denom = tl.maximum(ay, atol)
        rel = tl.math.div_rn(diff, denom)
    else:
        rel = tl.where(diff == 0.0, 0.0, tl.math.div_rn(diff, ay))
    diff = tl.where(inb, diff, 0.0)
    rel = tl.where(inb, rel, 0.0)
    d64 = diff.to(tl.float64)
    y64 = y.to(tl.float64)
    tl.store(out_f32 + pid * 2, tl.max(diff, axis=0))
    tl.store(out_f32 + pid * 2 + 1, tl.max(rel, axis=0))
    tl.store(out_f64 + pid * 2, tl.sum(d64 * d64, axis=0))
    tl.store(out_f64 + pid * 2 + 1, tl.sum(y64 * y64, axis=0))
    tl.store(out_i32 + pid * 4, tl.sum(matched.to(tl.int32), axis=0))
    tl.store(out_i32 + pid * 4 + 1, tl.sum(nonfinite.to(tl.int32), axis=0))
    tl.store(out_i32 + pid * 4 + 2, tl.sum((inb & (x != 0.0)).to(tl.int32), axis=0))
    tl.store(out_i32 + pid * 4 + 3, tl.sum((inb & (y != 0.0)).to(tl.int32), axis=0))


@dataclass(frozen=True)
class Totals:
    """A chunk's totals (meaningful only when ``nonfinite`` is 0)."""

    matched: int
    nonfinite: int
    out_nonzero: bool
    ref_nonzero: bool
    max_abs: float
    max_rel: float
    sq_diff: float
    sq_ref: float


def can_fuse(x: torch.Tensor, y: torch.Tensor, atol: float) -> bool:
    """Whether :func:`fused_totals` takes this pair on CUDA: flat contiguous tensors of
    one native dtype each on one CUDA device, and an atol that keeps its sign in float32."""
    return (
        x.is_cuda
        and y.device == x.device
        and x.dtype in NATIVE_DTYPES
        and y.dtype in NATIVE_DTYPES
        and x.dim() == 1
        and y.dim() == 1
        and x.is_contiguous()
        and y.is_contiguous()
        and x.numel() == y.numel()
        and _keeps_sign(atol)
    )


def _keeps_sign(atol: float) -> bool:
    return atol == 0.0 or float(torch.tensor(atol, dtype=torch.float32)) > 0.0


def fused_totals(x: torch.Tensor, y: torch.Tensor, rtol: float, atol: float) -> Totals:
    """The totals of one flat chunk pair in one pass (module docstring); one device sync."""
    if not _keeps_sign(atol):
        raise ValueError(f"atol {atol!r} is positive but rounds to 0 in float32")
    n = x.numel()
    if y.numel() != n:
        raise ValueError(f"chunks differ in size: {n} and {y.numel()} elements")
    if n == 0:
        return Totals(0, 0, False, False, 0.0, 0.0, 0.0, 0.0)
    blocks = triton.cdiv(n, BLOCK)
    f32 = torch.empty(blocks, 2, dtype=torch.float32, device=x.device)
    f64 = torch.empty(blocks, 2, dtype=torch.float64, device=x.device)
    i32 = torch.empty(blocks, 4, dtype=torch.int32, device=x.device)
    launch: dict[str, Any] = {"ATOL_POSITIVE": atol > 0.0, "BLOCK": BLOCK}
    if x.is_cuda:  # a compile option; the interpreter (CPU tests) compiles nothing
        launch["enable_fp_fusion"] = False
    _partials[(blocks,)](x, y, n, rtol, atol, f32, f64, i32, **launch)
    mx = f32.amax(dim=0).double()
    sums = f64.sum(dim=0)
    counts = i32.sum(dim=0, dtype=torch.int64).double()
    matched, nonfinite, out_nz, ref_nz, max_abs, max_rel, sq_d, sq_r = torch.cat(
        [counts, mx, sums]
    ).tolist()
    return Totals(
        matched=int(matched),
        nonfinite=int(nonfinite),
        out_nonzero=out_nz > 0,
        ref_nonzero=ref_nz > 0,
        max_abs=max_abs,
        max_rel=max_rel,
        sq_diff=sq_d,
        sq_ref=sq_r,
    )
