"""Emulation of the low-precision matmuls a device lacks, so that REFERENCES run anywhere.

SOL-ExecBench's NVFP4 references call ``torch._scaled_mm`` with packed FP4 operands and
block scales, a Blackwell-only kernel (Hopper: CUBLAS_STATUS_NOT_SUPPORTED; the CPU: "Invalid
scaling configuration"). Every such call in the 11 NVFP4 Quant references has one form::

    torch._scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=torch.bfloat16 | float32)

with ``a`` a (M, K/2) ``float4_e2m1fn_x2`` tensor (K contiguous), ``b`` the transposed
view (K/2, N) of an (N, K/2) one, and ``scale_a``/``scale_b`` flat ``float8_e4m3fn`` tensors
in cuBLAS's swizzled 128x4 layout (one scale per 16 values of K); the global decode scales
are applied by the reference itself after the call. The FP8 Quant references dequantize by
hand and never call ``_scaled_mm``.

:func:`install` replaces ``torch._scaled_mm`` with a dispatcher that decides **per call**,
from the operand dtypes, the scale dtypes/shapes (torch's own scaling classification, same
priority order) and the operands' device, whether the native op supports it: packed FP4 with
e4m3 1x16 scales (NVFP4) and FP8 with e8m0 1x32 scales (MXFP8) natively only on CUDA devices
of compute capability 10.0 or more; FP8 with float32 per-tensor or row-wise scales natively
on CUDA 8.9+; on the CPU per-tensor always, row-wise where this torch's CPU kernel takes it
(probed once: torch 2.13 does, 2.11 does not). ROCm devices and configurations this module
does not emulate (FP8 1x128/128x128 block scales, FP8 outputs) always go to the native op,
which then raises its own error where it has no kernel. Nothing is switched by problem name.

The arithmetic (:func:`emulated_scaled_mm`), exactly the definition of the native op:
dequantize each operand to float32 (e2m1 value x its block's scale; both factors are exact
in float32 and so is their product: 2 + 4 significand bits, exponents within range), one
float32 matmul (TF32 and reduced-precision reductions switched off for the call), add
``bias`` in float32, round once to ``out_dtype`` (round to nearest even). Residual difference
from the native kernel: only the order (and the internal width) of the K-sum; cuBLAS
accumulates block products on tensor cores in its own order, so results may differ by a few
float32 ulps of the accumulator before the final rounding (occasionally one bf16 ulp of the
output). Exception: Ada/Hopper FP8 tensor cores accumulate in a truncating register of about
13 mantissa bits before cuBLAS promotes the partial sums to float32, so there the native FP8
result is the less exact one (``tests/problem/test_emulation.py`` bounds the difference by
2^-9 of the sum of |products|). Per-tensor/row-wise FP8 scales are applied to the float32
accumulator as ``acc * (scale_a * scale_b)`` the way cuBLAS applies its alpha; torch's CPU
kernel may scale the operands first instead, which also differs only in float32 rounding.

Only references get this: :func:`install` is called by the guard's reference worker
(``ReferenceRole``); candidate processes never have it, so a candidate must bring its own
kernels for what the device lacks. Not covered: ``torch.ops.aten._scaled_mm`` called
directly, ``torch.nn.functional.scaled_mm`` (the newer API with explicit swizzle
arguments), ``torch._scaled_grouped_mm``, MXFP4 (packed FP4 with e8m0 scales: ROCm-only in
``_scaled_mm``), FP8 outputs with ``scale_result``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelarc.errors import KernelArcError
from kernelarc.problem.lowbit import dequantize_e2m1, unpack_fp4x2

if TYPE_CHECKING:
    import torch

#: The 128x4 tile of cuBLAS's block-scale layout (rows x scale columns).
TILE_ROWS, TILE_COLS = 128, 4
NVFP4 = "NVFP4 (float4_e2m1fn_x2, float8_e4m3fn 1x16 block scales, swizzled)"
MXFP8 = "MXFP8 (float8, float8_e8m0fnu 1x32 block scales, swizzled)"
TENSORWISE = "FP8 per-tensor scales"
ROWWISE = "FP8 row-wise scales"
OTHER = "other"


class EmulationError(KernelArcError, ValueError):
    """The arguments are not a configuration the native op accepts (or one not emulated)."""


# ---------------------------------------------------------------- block-scale layout


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def swizzled_numel(rows: int, blocks: int) -> int:
    """Elements of a swizzled scale tensor for ``rows`` x ``blocks`` scales (padded)."""
    return _round_up(rows, TILE_ROWS) * _round_up(blocks, TILE_COLS)


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Plain (rows, blocks) scales -> the flat swizzled layout ``_scaled_mm`` reads.

    Rows are padded to a multiple of 128 and blocks to a multiple of 4 (with zeros); tiles
    of 128x4 follow each other row-tile-major, and inside a tile scale ``(r, c)`` sits at
    ``(r % 32) * 16 + (r // 32) * 4 + c``."""
    import torch

    if scales.ndim != 2:
        raise EmulationError(f"plain scales must be 2-D (rows, blocks), got {tuple(scales.shape)}")
    rows, cols = scales.shape
    rp, cp = _round_up(rows, TILE_ROWS), _round_up(cols, TILE_COLS)
    raw = _as_bytes(scales)
    padded = torch.zeros((rp, cp), dtype=raw.dtype, device=raw.device)
    padded[:rows, :cols] = raw
    tiles = padded.view(rp // TILE_ROWS, TILE_ROWS, cp // TILE_COLS, TILE_COLS)
    tiles = tiles.permute(0, 2, 1, 3).reshape(-1, 4, 32, TILE_COLS).transpose(1, 2)
    return tiles.reshape(-1).view(scales.dtype)


def unswizzle_scales(flat: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """The inverse of :func:`swizzle_scales`: a (rows, blocks) tensor, padding dropped."""
    rp, cp = _round_up(rows, TILE_ROWS), _round_up(blocks, TILE_COLS)
    if flat.numel() != rp * cp:
        raise EmulationError(
            f"swizzled scales for {rows}x{blocks} blocks need {rp * cp} elements "
            f"(padded to {rp}x{cp}), got {flat.numel()}"
        )
    raw = _as_bytes(flat.reshape(-1))
    grid = raw.view(rp // TILE_ROWS, cp // TILE_COLS, 32, 4, TILE_COLS)
    plain = grid.permute(0, 3, 2, 1, 4).reshape(rp, cp)
    return plain[:rows, :blocks].contiguous().view(flat.dtype)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret a one-byte float tensor as uint8 (copies of these dtypes are limited)."""
    import torch

    if t.element_size() != 1:
        raise EmulationError(f"block scales must be one-byte floats, got {t.dtype}")
    return t.view(torch.uint8)


# ---------------------------------------------------------------- dequantization


def fp4x2_values(packed: torch.Tensor, *, packed_dim: int) -> torch.Tensor:
    """Float32 e2m1 values of a packed 2-D FP4x2 tensor; ``packed_dim`` is the dimension
    along which byte ``i`` holds elements ``2i`` (low nibble) and ``2i+1`` (high nibble),
    which must be the contiguous one (the only layout the native kernels read)."""
    if packed.ndim != 2:
        raise EmulationError(f"FP4x2 operands must be 2-D, got {tuple(packed.shape)}")
    if packed.stride(packed_dim) != 1 and packed.shape[packed_dim] > 1:
        raise EmulationError(
            f"FP4x2 operand of shape {tuple(packed.shape)} with strides {packed.stride()}: "
            f"the packed K dimension ({packed_dim}) must be contiguous"
        )
    raw = _as_bytes(packed)
    if packed_dim == 1:
        return dequantize_e2m1(unpack_fp4x2(raw))
    return dequantize_e2m1(unpack_fp4x2(raw.t())).t()


def dequantize_blocks(values: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """``values`` (rows, K) float32 times plain ``scales`` (rows, K/block), each scale applied
    to ``block`` consecutive values of its row; float32 result."""
    import torch

    rows, k = values.shape
    if k % block or tuple(scales.shape) != (rows, k // block):
        raise EmulationError(
            f"{tuple(values.shape)} values need ({rows}, {k}/{block}) scales, "
            f"got {tuple(scales.shape)}"
        )
    s = scales.to(torch.float32).repeat_interleave(block, dim=1)
    return values.to(torch.float32) * s


# ---------------------------------------------------------------- classification


def _is_fp8(t: torch.Tensor) -> bool:
    import torch

    return t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _fp4(t: torch.Tensor) -> bool:
    import torch

    return t.dtype == getattr(torch, "float4_e2m1fn_x2", None)


def classify(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> str:
    """Torch's scaling classification of a ``_scaled_mm`` call (same checks and priority):
    one of :data:`TENSORWISE`, :data:`ROWWISE`, :data:`MXFP8`, :data:`NVFP4`, :data:`OTHER`."""
    import torch

    if a.ndim != 2 or b.ndim != 2:
        return OTHER
    m, n = a.shape[0], b.shape[1]
    f32 = torch.float32
    if _is_fp8(a) and _is_fp8(b) and sa.dtype == f32 and sb.dtype == f32:
        if sa.numel() == 1 and sb.numel() == 1:
            return TENSORWISE
        if (
            tuple(sa.shape) == (m, 1)
            and tuple(sb.shape) == (1, n)
            and sa.is_contiguous()
            and sb.t().is_contiguous()
        ):
            return ROWWISE
        return OTHER
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if _is_fp8(a) and _is_fp8(b) and sa.dtype == e8m0 and sb.dtype == e8m0:
        k = a.shape[1]
        if (
            sa.numel() == swizzled_numel(m, -(-k // 32))
            and sb.numel() == swizzled_numel(n, -(-k // 32))
            and sa.is_contiguous()
            and sb.is_contiguous()
        ):
            return MXFP8
        return OTHER
    if _fp4(a) and _fp4(b) and sa.dtype == torch.float8_e4m3fn == sb.dtype:
        k = 2 * a.shape[1]
        if (
            sa.numel() == swizzled_numel(m, -(-k // 16))
            and sb.numel() == swizzled_numel(n, -(-k // 16))
            and sa.is_contiguous()
            and sb.is_contiguous()
        ):
            return NVFP4
    return OTHER


def has_native(kind: str, device: torch.device) -> bool:
    """Whether the native ``_scaled_mm`` has a kernel for ``kind`` on ``device``."""
    import torch

    if kind == OTHER:
        return True  # not emulated: the native op runs (or raises its own error)
    if device.type == "cuda":
        if torch.version.hip:
            return True  # ROCm's support differs per arch; not judged here
        cap = torch.cuda.get_device_capability(device)
        return cap >= ((10, 0) if kind in (NVFP4, MXFP8) else (8, 9))
    if device.type == "cpu":
        return kind == TENSORWISE or (kind == ROWWISE and _cpu_rowwise_native())
    return True


@functools.cache
def _cpu_rowwise_native() -> bool:
    """Whether this torch's CPU ``_scaled_mm`` takes row-wise FP8 scales (2.13 does; 2.11
    raises "only supports per-tensor scaling for CPU backend"): one tiny native call."""
    import torch

    native = _installed[0] if _installed is not None else torch._scaled_mm
    a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn)
    b = torch.zeros(16, 16, dtype=torch.float8_e4m3fn).t()
    try:
        native(a, b, torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


# ---------------------------------------------------------------- the emulated op


@contextlib.contextmanager
def _ieee_fp32() -> Iterator[None]:
    """Full float32 matmuls for the duration (no TF32, no reduced-precision reductions)."""
    import torch

    before = torch.get_float32_matmul_precision()
    if before != "highest":
        torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        if before != "highest":
            torch.set_float32_matmul_precision(before)


def emulated_scaled_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """``torch._scaled_mm`` by its arithmetic definition (module docstring), with the
    native op's argument checks. ``use_fast_accum`` changes nothing here (float32 sums)."""
    import torch

    kind = classify(mat_a, mat_b, scale_a, scale_b)
    if kind == OTHER:
        raise EmulationError(
            f"_scaled_mm configuration not emulated: a {mat_a.dtype} {tuple(mat_a.shape)}, "
            f"b {mat_b.dtype} {tuple(mat_b.shape)}, scale_a {scale_a.dtype} "
            f"{tuple(scale_a.shape)}, scale_b {scale_b.dtype} {tuple(scale_b.shape)}"
        )
    out_dtype = out_dtype or mat_a.dtype
    _check_args(mat_a, mat_b, bias, out_dtype, use_fast_accum, kind)
    del scale_result  # the native op ignores it for 16- and 32-bit outputs
    m, n = mat_a.shape[0], mat_b.shape[1]
    if kind in (NVFP4, MXFP8):
        block = 16 if kind == NVFP4 else 32
        if kind == NVFP4:
            va, vb = fp4x2_values(mat_a, packed_dim=1), fp4x2_values(mat_b, packed_dim=0)
        else:
            va, vb = mat_a.to(torch.float32), mat_b.to(torch.float32)
        k = va.shape[1]
        plain_a = unswizzle_scales(scale_a, m, k // block)
        plain_b = unswizzle_scales(scale_b, n, k // block)
        da = dequantize_blocks(va, plain_a, block)
        db = dequantize_blocks(vb.t(), plain_b, block).t()
        with _ieee_fp32():
            acc = da @ db
    else:
        with _ieee_fp32():
            acc = mat_a.to(torch.float32) @ mat_b.to(torch.float32)
        sa, sb = scale_a.to(torch.float32), scale_b.to(torch.float32)
        acc = acc * (sa.reshape(()) * sb.reshape(())) if kind == TENSORWISE else acc * sa * sb
    if bias is not None:
        acc = acc + bias.to(torch.float32)
    return acc.to(out_dtype)


def _check_args(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    use_fast_accum: bool,
    kind: str,
) -> None:
    import torch

    if a.shape[1] != b.shape[0]:
        raise EmulationError(f"shapes cannot be multiplied ({tuple(a.shape)} and {tuple(b.shape)})")
    if a.shape[1] % 16 or b.shape[0] % 16 or b.shape[1] % 16:
        raise EmulationError(
            f"_scaled_mm needs mat1's trailing dimension and both of mat2's divisible by 16, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.dtype == torch.float8_e5m2 and b.dtype == torch.float8_e5m2:
        raise EmulationError("multiplication of two float8_e5m2 matrices is not supported")
    if use_fast_accum and kind == NVFP4:
        raise EmulationError("use_fast_accum is not supported with float4_e2m1fn_x2 operands")
    if out_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise EmulationError(f"out_dtype {out_dtype} is not emulated (float32/bfloat16/float16)")
    if bias is not None:
        if bias.numel() != b.shape[1]:
            raise EmulationError(f"bias must have {b.shape[1]} elements, got {bias.numel()}")
        if out_dtype == torch.float32:
            raise EmulationError("bias is not supported when out_dtype is float32")
        if bias.dtype not in (torch.bfloat16, torch.float16) or (
            out_dtype in (torch.bfloat16, torch.float16) and bias.dtype != out_dtype
        ):
            raise EmulationError(f"bias must be {out_dtype} for a {out_dtype} output")


# ---------------------------------------------------------------- installer


@dataclass
class EmulationRecord:
    """What the installed dispatcher did: the configurations it emulated, and call counts."""

    ops: set[str] = field(default_factory=set)
    emulated_calls: int = 0
    native_calls: int = 0

    def describe(self) -> list[str]:
        return [f"torch._scaled_mm[{op}]" for op in sorted(self.ops)]


_installed: tuple[Callable[..., Any], EmulationRecord] | None = None


def install() -> EmulationRecord:
    """Route ``torch._scaled_mm`` through the per-call dispatcher in this process (until
    :func:`uninstall`). Idempotent: a second call returns the same record."""
    global _installed
    import torch

    if _installed is not None:
        return _installed[1]
    native = torch._scaled_mm
    record = EmulationRecord()

    @functools.wraps(native)
    def dispatch(mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, *args: Any, **kw: Any) -> Any:
        kind = classify(mat_a, mat_b, scale_a, scale_b)
        if has_native(kind, mat_a.device):
            record.native_calls += 1
            return native(mat_a, mat_b, scale_a, scale_b, *args, **kw)
        out = kw.pop("out", None)
        result = emulated_scaled_mm(mat_a, mat_b, scale_a, scale_b, *args, **kw)
        record.emulated_calls += 1
        record.ops.add(kind)
        if out is not None:
            out.resize_(result.shape).copy_(result)
            return out
        return result

    torch._scaled_mm = dispatch  # type: ignore[assignment]
    _installed = (native, record)
    return record


def uninstall() -> None:
    """Put the native ``torch._scaled_mm`` back (no-op when not installed)."""
    global _installed
    import torch

    if _installed is not None:
        torch._scaled_mm = _installed[0]  # type: ignore[assignment]
        _installed = None


@contextlib.contextmanager
def emulation() -> Iterator[EmulationRecord]:
    """:func:`install` for the duration of a ``with`` block (restores what was there)."""
    already = _installed is not None
    record = install()
    try:
        yield record
    finally:
        if not already:
            uninstall()
