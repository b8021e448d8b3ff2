"""Correctness of one output against its reference, with SOL-ExecBench's rules.

The rules, in the order they are applied (the first that fails decides the status):

1. ``type``: the output must be exactly ``torch.Tensor`` (``type(out) is torch.Tensor``):
   subclasses (``nn.Parameter``, FakeTensor, tensor wrappers), non-strided layouts (sparse)
   and tensors on devices other than ``cpu``/``cuda`` (``meta``, ``lazy``, ...) fail.
2. ``shape`` then ``dtype`` against the definition; the message shows expected and got.
3. ``numerical``, with both sides cast to float32, chunk by chunk:

   - a NaN or Inf in either tensor fails, except at positions where both are ``-inf`` and
     ``tolerance.allow_negative_inf`` is set (those count as matched). ``has_nan`` and
     ``has_inf`` say whether either tensor holds one at all, excused or not;
   - an all-zero output fails when the reference is not all zero;
   - an element matches when ``|x - y| <= atol + rtol * |y|``; the output fails when
     ``matched / total < required_matched_ratio`` (exactly at the ratio passes);
   - with ``max_error_cap`` set, a maximum absolute error above it fails.

Reported errors are over positions where both values are finite: the absolute error
``|x - y|`` and the relative error ``|x - y| / max(|y|, atol)`` (atol is the floor of
``|y|``; with atol 0 and y 0 the relative error is 0 when x is 0, else inf).
``rel_l2_error`` is ``||x - y|| / ||y||`` accumulated in float64 over the same positions
(None when ``||y||`` is 0); :func:`precision_level` reads it.

Integer and bool outputs (:data:`EXACT_DTYPES`) deviate on purpose from the official
harness, which casts them to float32 and applies the float tolerance (so an index of 1000
off by 10 would match there): here an element matches only when it is equal, compared in
int64; the absolute error is the integer difference and the relative error divides it by
``max(|y|, 1)``. The matched ratio still applies; NaN/Inf cannot occur.
Pass ``exact_integers=False`` for the official behaviour.

Memory: the tensors are walked in chunks of ``chunk_elems`` flattened elements (64 Mi by
default), so the float32 temporaries never exceed a few chunk sizes. A non-contiguous
output is flattened with one copy in its own dtype. Computation happens on ``device`` when
given, else on the output's device. On CUDA, float chunks of ``FUSED_MIN_ELEMS`` or more
are compared in one Triton pass (``compare_fused``: the same matched counts and maxima, the
float64 sums of squares to rounding).

Not covered: Python scalar outputs, tuples (the caller checks each output), and the 10
rounds with fresh inputs (the evaluator's job).
"""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING, Any

import torch

from kernelarc.guard.messages import OutputCheck
from kernelarc.problem.schema import Tolerance

if TYPE_CHECKING:  # compare_fused imports Triton: only where the fused path runs
    from kernelarc.guard.compare_fused import Totals

#: Output dtypes compared for equality (in int64), not with the float tolerance.
EXACT_DTYPES: frozenset[torch.dtype] = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    }
)

#: Devices whose tensors hold real data that can be compared.
_REAL_DEVICES = frozenset({"cpu", "cuda"})

#: Default chunk: 64 Mi elements (256 MiB per float32 temporary).
DEFAULT_CHUNK_ELEMS = 1 << 26

#: Chunks of at least this many CUDA elements are compared in one fused Triton pass
#: (``compare_fused``): below it the torch passes cost well under a millisecond, and the
#: kernel's first compile in a worker (about a second) is not worth paying.
FUSED_MIN_ELEMS = 1 << 20
_HAS_TRITON = importlib.util.find_spec("triton") is not None


class ReferenceMismatch(ValueError):
    """The reference output itself does not fit the definition (an invalid reference)."""


def _type_problem(out: Any) -> str | None:
    if type(out) is not torch.Tensor:
        return f"is a {type(out).__module__}.{type(out).__qualname__}, not a plain torch.Tensor"
    if out.layout != torch.strided:
        return f"has layout {out.layout}, not a dense (strided) tensor"
    if out.device.type not in _REAL_DEVICES:
        return f"lives on device {out.device.type!r}, which holds no data (want cpu or cuda)"
    return None


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)


class _Acc:
    """Running totals over chunks (local to one call)."""

    def __init__(self) -> None:
        self.matched = 0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.nan = False
        self.inf = False
        self.out_nonzero = False
        self.ref_nonzero = False
        self.bad_nonfinite = 0  # NaN/Inf positions not excused by allow_negative_inf
        self.sq_diff = 0.0
        self.sq_ref = 0.0

    def add_finite(self, t: Totals) -> None:
        """Add the totals of a chunk whose differences are all finite."""
        self.matched += t.matched
        self.out_nonzero |= t.out_nonzero
        self.ref_nonzero |= t.ref_nonzero
        self.max_abs = max(self.max_abs, t.max_abs)
        self.max_rel = max(self.max_rel, t.max_rel)
        self.sq_diff += t.sq_diff
        self.sq_ref += t.sq_ref


def _chunk_float(x: torch.Tensor, y: torch.Tensor, tol: Tolerance, acc: _Acc) -> None:
    """One chunk; the common case, every ``|x - y|`` finite (then so is every x and y),
    in about half the memory traffic of :func:`_chunk_float_masked` and one device sync for
    its totals; any non-finite difference (a NaN or Inf on either side, or an overflowing
    difference) goes to :func:`_chunk_float_masked`. Both give the same totals, bit for bit
    (``tests/guard/test_compare.py``). The comparison is the largest part of a correctness
    round on a problem with tens of GB of outputs (docs/PERFORMANCE.md)."""
    diff = torch.sub(x, y).abs_()
    if not bool(torch.isfinite(diff).all()):
        del diff
        _chunk_float_masked(x, y, tol, acc)
        return
    atol, rtol = float(tol.max_atol), float(tol.max_rtol)
    if not acc.out_nonzero:  # once seen, not looked for again
        acc.out_nonzero = bool((x != 0).any())
    if not acc.ref_nonzero:
        acc.ref_nonzero = bool((y != 0).any())
    ay = y.abs()
    limit = ay.mul(rtol).add_(atol)  # atol + rtol * |y|, rounded as the masked path does
    matched = (diff <= limit).sum()
    del limit
    denom = ay.clamp_(min=atol) if atol > 0 else ay
    rel = diff / denom  # 0 where diff is 0: denom is at least atol > 0
    if atol <= 0:
        rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    rel_max = rel.max()
    del rel, denom, ay
    d64 = diff.double()
    sq_diff = d64.mul_(d64).sum()
    del d64
    y64 = y.double()
    sq_ref = y64.mul_(y64).sum()
    del y64
    totals = torch.stack([matched.double(), diff.max().double(), rel_max.double(), sq_diff, sq_ref])
    n, max_abs, max_rel, sq_d, sq_r = totals.tolist()
    acc.matched += int(n)
    acc.max_abs = max(acc.max_abs, max_abs)
    acc.max_rel = max(acc.max_rel, max_rel)
    acc.sq_diff += sq_d
    acc.sq_ref += sq_r


def _chunk_fused(x: torch.Tensor, y: torch.Tensor, tol: Tolerance, acc: _Acc) -> bool:
    """One chunk of :data:`FUSED_MIN_ELEMS` or more CUDA elements in one Triton pass
    (``compare_fused``), when every difference is finite; False leaves the chunk to the torch
    paths (CPU tensors, small chunks, other dtypes, no Triton). A chunk with a non-finite
    difference goes to :func:`_chunk_float_masked` here, as in :func:`_chunk_float`. A
    kernel that fails (a Triton that cannot compile) raises: the guard answers check-error
    and rejects the candidate, never judging it some other way unseen."""
    if not (x.is_cuda and x.numel() >= FUSED_MIN_ELEMS and _HAS_TRITON):
        return False
    from kernelarc.guard import compare_fused  # imports Triton: only where the fused path runs

    atol, rtol = float(tol.max_atol), float(tol.max_rtol)
    if not compare_fused.can_fuse(x, y, atol):
        return False
    t = compare_fused.fused_totals(x, y, rtol, atol)
    if t.nonfinite:
        _chunk_float_masked(x.float(), y.float(), tol, acc)
    else:
        acc.add_finite(t)
    return True


def _chunk_float_masked(x: torch.Tensor, y: torch.Tensor, tol: Tolerance, acc: _Acc) -> None:
    """One chunk holding a non-finite value or difference: every total over the finite
    positions only (module docstring)."""
    atol, rtol = float(tol.max_atol), float(tol.max_rtol)
    nan = torch.isnan(x) | torch.isnan(y)
    inf = torch.isinf(x) | torch.isinf(y)
    acc.nan |= bool(nan.any())
    acc.inf |= bool(inf.any())
    finite = ~(nan | inf)
    acc.out_nonzero |= bool((x != 0).any())
    acc.ref_nonzero |= bool((y != 0).any())
    diff = torch.where(finite, (x - y).abs(), torch.zeros((), dtype=x.dtype, device=x.device))
    ay = y.abs()
    match = finite & (diff <= atol + rtol * ay)
    if tol.allow_negative_inf:
        neg = torch.tensor(-math.inf, dtype=x.dtype, device=x.device)
        match |= (x == neg) & (y == neg)
    acc.bad_nonfinite += int((~finite & ~match).sum())
    acc.matched += int(match.sum())
    if diff.numel():
        acc.max_abs = max(acc.max_abs, float(diff.max()))
        denom = torch.clamp(ay, min=atol) if atol > 0 else ay
        rel = torch.where(diff == 0, torch.zeros_like(diff), diff / denom)
        rel = torch.where(finite, rel, torch.zeros_like(rel))
        acc.max_rel = max(acc.max_rel, float(rel.max()))
    d64 = diff.double()
    y64 = torch.where(finite, y, torch.zeros_like(y)).double()
    acc.sq_diff += float((d64 * d64).sum())
    acc.sq_ref += float((y64 * y64).sum())


def _chunk_exact(x: torch.Tensor, y: torch.Tensor, acc: _Acc) -> None:
    diff = (x - y).abs()
    acc.matched += int((diff == 0).sum())
    acc.out_nonzero |= bool((x != 0).any())
    acc.ref_nonzero |= bool((y != 0).any())
    if diff.numel():
        mx = float(diff.max())
        acc.max_abs = max(acc.max_abs, mx)
        rel = diff.double() / torch.clamp(y.abs().double(), min=1.0)
        acc.max_rel = max(acc.max_rel, float(rel.max()))
    acc.sq_diff += float((diff.double() ** 2).sum())
    acc.sq_ref += float((y.double() ** 2).sum())


def check_output(
    name: str,
    out: Any,
    ref: torch.Tensor,
    tol: Tolerance,
    *,
    expected_shape: tuple[int, ...],
    expected_dtype: torch.dtype,
    device: torch.device | None = None,
    exact_integers: bool = True,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> OutputCheck:
    """Judge one output ``out`` against ``ref`` (see the module docstring for the rules).

    Raises :class:`ReferenceMismatch` when ``ref`` is not a tensor of ``expected_shape``:
    that is a broken reference, not a wrong candidate.
    """
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be positive, got {chunk_elems}")
    if not isinstance(ref, torch.Tensor) or _type_problem(ref) is not None:
        raise ReferenceMismatch(f"reference output {name!r} is not a plain dense tensor")
    shape = tuple(int(d) for d in expected_shape)
    if tuple(ref.shape) != shape:
        raise ReferenceMismatch(
            f"reference output {name!r} has shape {tuple(ref.shape)}, the definition says {shape}"
        )
    problem = _type_problem(out)
    if problem is not None:
        return OutputCheck(status="type", message=f"output {name!r} {problem}")
    if tuple(out.shape) != shape:
        return OutputCheck(
            status="shape",
            message=f"output {name!r}: shape expected {shape}, got {tuple(out.shape)}",
        )
    if out.dtype != expected_dtype:
        return OutputCheck(
            status="dtype",
            message=f"output {name!r}: dtype expected {expected_dtype}, got {out.dtype}",
        )

    exact = exact_integers and expected_dtype in EXACT_DTYPES
    work_dtype = torch.int64 if exact else torch.float32
    dev = device if device is not None else out.device
    xs, ys = _flat(out), _flat(ref)
    total = xs.numel()
    acc = _Acc()
    for lo in range(0, total, chunk_elems):
        x = xs[lo : lo + chunk_elems].to(device=dev)
        y = ys[lo : lo + chunk_elems].to(device=dev)
        if exact:
            _chunk_exact(x.to(dtype=work_dtype), y.to(dtype=work_dtype), acc)
        elif not _chunk_fused(x, y, tol, acc):
            _chunk_float(x.to(dtype=work_dtype), y.to(dtype=work_dtype), tol, acc)
        del x, y

    ratio = acc.matched / total if total else 1.0
    rel_l2 = math.sqrt(acc.sq_diff) / math.sqrt(acc.sq_ref) if acc.sq_ref > 0 else None
    stats: dict[str, Any] = {
        "max_absolute_error": acc.max_abs,
        "max_relative_error": acc.max_rel,
        "matched_ratio": ratio,
        "has_nan": acc.nan,
        "has_inf": acc.inf,
        "rel_l2_error": rel_l2,
    }
    failure = _first_failure(name, acc, ratio, tol, exact)
    if failure is not None:
        return OutputCheck(status="numerical", message=failure, **stats)
    return OutputCheck(
        status="ok",
        message=f"output {name!r}: {ratio:.4%} of {total} elements match, "
        f"max abs error {acc.max_abs:.3g}, max rel error {acc.max_rel:.3g}",
        **stats,
    )


def _first_failure(name: str, acc: _Acc, ratio: float, tol: Tolerance, exact: bool) -> str | None:
    if acc.bad_nonfinite:
        kinds = " and ".join(k for k, v in (("NaN", acc.nan), ("Inf", acc.inf)) if v)
        excuse = " (not both -inf)" if tol.allow_negative_inf else ""
        return (
            f"output {name!r}: {kinds} at {acc.bad_nonfinite} positions of the output or "
            f"the reference{excuse}"
        )
    if acc.ref_nonzero and not acc.out_nonzero:
        return f"output {name!r}: all-zero output while the reference is not all zero"
    if ratio < tol.required_matched_ratio:
        rule = "x == y" if exact else f"|x-y| <= {tol.max_atol:g} + {tol.max_rtol:g}*|y|"
        return (
            f"output {name!r}: {ratio:.4%} of elements match ({rule}), "
            f"need {tol.required_matched_ratio:.4%}; max abs error {acc.max_abs:.3g}, "
            f"max rel error {acc.max_rel:.3g}"
        )
    if tol.max_error_cap is not None and acc.max_abs > tol.max_error_cap:
        return (
            f"output {name!r}: max abs error {acc.max_abs:.3g} exceeds the cap "
            f"{tol.max_error_cap:g}"
        )
    return None


#: Below this relative L2 error a float32 output is consistent with fp32 arithmetic. fp32's
#: unit roundoff is 2^-24 ~ 6e-8; a 256-long dot product of random data computed in fp32
#: measures ~3e-7 against an exact result, and accumulation error grows slowly with length
#: (blocked sums). TF32 inputs measure ~3e-4 on the same data: 1e-5 is their geometric middle.
FP32_LIKE_MAX_REL_L2 = 1e-5
#: Below this (and at or above the fp32 bound) the error is what 11-bit significands give:
#: TF32 (and fp16) keep 10 stored mantissa bits, unit roundoff 2^-11 ~ 4.9e-4, and rounding
#: both operands of each product measures ~3e-4. bf16 keeps 7 bits (2^-8 ~ 3.9e-3) and
#: measures ~2.3e-3. 1e-3 is the geometric middle of those two, a factor ~3 from each.
TF32_LIKE_MAX_REL_L2 = 1e-3


def precision_level(rel_l2: float, out_dtype: torch.dtype) -> str | None:
    """Which arithmetic a float32 output's error looks like: None (fp32), ``"tf32-level"``
    or ``"bf16-level"``. Outputs of other dtypes give None (their own precision is the
    contract). A hint for the ``precision`` check, not a proof: a reference that itself
    computes in lower precision moves every candidate's level.
    """
    if math.isnan(rel_l2) or rel_l2 < 0:
        raise ValueError(f"rel_l2 must be a non-negative number, got {rel_l2}")
    if out_dtype != torch.float32:
        return None
    if rel_l2 < FP32_LIKE_MAX_REL_L2:
        return None
    if rel_l2 < TF32_LIKE_MAX_REL_L2:
        return "tf32-level"
    return "bf16-level"
