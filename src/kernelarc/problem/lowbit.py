"""Low-precision helpers for input generation: FP4 (E2M1) codes and packing, FP8 casts.

E2M1 is a 4-bit float: one sign bit (bit 3), two exponent bits and one mantissa bit. Its
eight magnitudes, by code 0..7, are 0, 0.5, 1, 1.5, 2, 3, 4 and 6; code ``c | 8`` is the
negative of code ``c``. There is no NaN or infinity.

- :func:`quantize_e2m1` rounds to the nearest representable value; a value exactly halfway
  between two goes to the even code (the one whose mantissa bit is 0). Magnitudes above 6
  saturate to 6. NaN inputs are rejected (E2M1 cannot hold them).
- ``float4_e2m1fn_x2`` packs two codes per byte: element ``2i`` of the last dimension goes
  in the **low** nibble of byte ``i`` and element ``2i+1`` in the high nibble (the order
  SOL-ExecBench's NVFP4 references use). A packed tensor's declared shape counts bytes, so
  its last dimension is half the logical one.
- The unpacked ``float4_e2m1`` dtype has no torch counterpart; we store it as ``uint8``
  holding one code per byte in the low nibble.

FP8 (``float8_e4m3fn``, ``float8_e5m2``) needs no helper beyond :func:`cast_fp8` (clamp,
then cast). :func:`torch_dtype_of`, :data:`DTYPE_BYTES` and :func:`from_float32` map a
definition dtype to its torch storage, its bytes per element and its final tensor.
Not covered: block scale factors (NVFP4/MXFP8); those are ordinary float tensors and
references compute them themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelarc.errors import KernelArcError
from kernelarc.problem.schema import DType

if TYPE_CHECKING:
    import torch

#: Magnitudes of E2M1 codes 0..7 (code | 8 is the negative).
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_MAX = 6.0


#: Bytes per element of each definition dtype (FP4x2: per packed byte, as shapes count).
DTYPE_BYTES = {
    DType.float64: 8, DType.float32: 4, DType.float16: 2, DType.bfloat16: 2,
    DType.float8_e4m3fn: 1, DType.float8_e5m2: 1, DType.float4_e2m1: 1,
    DType.float4_e2m1fn_x2: 1, DType.int64: 8, DType.int32: 4, DType.int16: 2,
    DType.int8: 1, DType.uint8: 1, DType.bool: 1,
}  # fmt: skip
FP8_DTYPES = (DType.float8_e4m3fn, DType.float8_e5m2)
FP4_DTYPES = (DType.float4_e2m1, DType.float4_e2m1fn_x2)


class LowBitError(KernelArcError, ValueError):
    """A low-precision conversion cannot be done (bad shape, NaN, missing torch dtype)."""


def torch_dtype_of(dt: DType) -> torch.dtype:
    """Torch storage dtype: ``float4_e2m1`` -> ``uint8`` (one code per byte); the others
    by name (``float4_e2m1fn_x2`` needs a torch build that has it)."""
    import torch

    if dt == DType.float4_e2m1:
        return torch.uint8
    if dt == DType.float4_e2m1fn_x2:
        return fp4x2_dtype()
    result = getattr(torch, dt.value, None)
    if not isinstance(result, torch.dtype):
        raise LowBitError(f"torch {torch.__version__} has no dtype {dt.value}")
    return result


def value_shape(dt: DType, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the float values behind a tensor: FP4x2 holds two per declared element."""
    if dt != DType.float4_e2m1fn_x2:
        return shape
    if not shape:
        raise LowBitError("a float4_e2m1fn_x2 tensor needs at least one (packed) dimension")
    return (*shape[:-1], 2 * shape[-1])


def lowest_value(dt: DType) -> float:
    """Most negative finite value of a float dtype (E2M1: -6)."""
    import torch

    return -E2M1_MAX if dt in FP4_DTYPES else float(torch.finfo(torch_dtype_of(dt)).min)


def from_float32(values: torch.Tensor, dt: DType, *, clamp_fp8: bool = True) -> torch.Tensor:
    """Final tensor of a float dtype from values of :func:`value_shape`: FP8 clamped to
    [-2, 2] (``clamp_fp8``) and cast, FP4 quantized (and packed for FP4x2)."""
    if dt == DType.float4_e2m1fn_x2:
        return fp4x2_from_float(values)
    if dt == DType.float4_e2m1:
        return quantize_e2m1(values)
    target = torch_dtype_of(dt)
    if dt in FP8_DTYPES:
        return cast_fp8(values, target, clamp=2.0 if clamp_fp8 else None)
    return values.to(target)


def fp4x2_dtype() -> torch.dtype:
    """``torch.float4_e2m1fn_x2``, or a clear error on a torch build without it."""
    import torch

    dtype = getattr(torch, "float4_e2m1fn_x2", None)
    if not isinstance(dtype, torch.dtype):
        raise LowBitError(
            f"this torch build ({torch.__version__}) has no torch.float4_e2m1fn_x2; "
            "FP4 (NVFP4) problems need torch >= 2.8"
        )
    return dtype


def quantize_e2m1(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (``uint8`` in 0..15, same shape as ``x``), round to nearest, ties to even."""
    import torch

    xf = x.detach().to(torch.float32)
    if bool(torch.isnan(xf).any()):
        raise LowBitError("cannot quantize NaN to E2M1 (the format has no NaN)")
    mag = xf.abs()
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=xf.device)
    # bucketize (right=False): mag == mids[i] lands in bucket i, i.e. the halfway point
    # between codes i and i+1 goes to i; move it to i+1 when i is odd (ties to even).
    codes = torch.bucketize(mag, mids)
    at_mid = (codes < len(_MIDPOINTS)) & (mag == mids[codes.clamp(max=len(_MIDPOINTS) - 1)])
    codes = codes + (at_mid & (codes % 2 == 1)).to(codes.dtype)
    sign = torch.signbit(xf).to(codes.dtype) * 8
    return (codes + sign).to(torch.uint8)


def dequantize_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of E2M1 codes (any integer tensor with values 0..15)."""
    import torch

    table = torch.tensor(
        list(E2M1_VALUES) + [-v for v in E2M1_VALUES], dtype=torch.float32, device=codes.device
    )
    return table[codes.to(torch.long) & 0xF]


def pack_fp4x2(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes ``[..., 2n]`` into ``float4_e2m1fn_x2`` ``[..., n]`` (low nibble first)."""
    import torch

    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise LowBitError(
            f"FP4x2 packing needs an even last dimension, got shape {tuple(codes.shape)}"
        )
    c = codes.to(torch.uint8) & 0xF
    packed = c[..., 0::2] | (c[..., 1::2] << 4)
    return packed.contiguous().view(fp4x2_dtype())


def unpack_fp4x2(packed: torch.Tensor) -> torch.Tensor:
    """E2M1 codes ``[..., 2n]`` (uint8) of a packed ``[..., n]`` tensor (fp4x2 or uint8)."""
    import torch

    if packed.ndim == 0:
        raise LowBitError("cannot unpack a 0-d FP4x2 tensor")
    raw = packed.contiguous().view(torch.uint8)
    low, high = raw & 0xF, raw >> 4
    return torch.stack((low, high), dim=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2)


def fp4x2_from_float(x: torch.Tensor) -> torch.Tensor:
    """Quantize ``x`` ``[..., 2n]`` to E2M1 and pack it into ``float4_e2m1fn_x2`` ``[..., n]``."""
    return pack_fp4x2(quantize_e2m1(x))


def fp4x2_to_float(packed: torch.Tensor) -> torch.Tensor:
    """Float32 ``[..., 2n]`` values of a packed FP4x2 tensor ``[..., n]``."""
    return dequantize_e2m1(unpack_fp4x2(packed))


def cast_fp8(x: torch.Tensor, dtype: torch.dtype, clamp: float | None = 2.0) -> torch.Tensor:
    """Clamp ``x`` to ``±clamp`` (and always to the format's finite range), then cast."""
    import torch

    limit = float(torch.finfo(dtype).max)
    if clamp is not None:
        limit = min(limit, clamp)
    return x.clamp(-limit, limit).to(dtype)
