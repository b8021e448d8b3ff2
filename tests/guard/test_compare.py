"""Tests of the official correctness rules in kernelarc.guard.compare, one rule at a time."""

from __future__ import annotations

import math

import pytest
import torch

import kernelarc.guard.compare as cmp
from kernelarc.guard.compare import (
    EXACT_DTYPES,
    OutputCheck,
    ReferenceMismatch,
    check_output,
    precision_level,
)
from kernelarc.problem.schema import Tolerance

TOL = Tolerance(max_atol=0.5, max_rtol=0.25, required_matched_ratio=1.0)


def check(out: object, ref: torch.Tensor, tol: Tolerance = TOL, **kw: object) -> OutputCheck:
    kw.setdefault("expected_shape", tuple(ref.shape))
    kw.setdefault("expected_dtype", ref.dtype)
    return check_output("y", out, ref, tol, **kw)  # type: ignore[arg-type]


def t(*values: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# ------------------------------------------------------------------ type, shape, dtype


def test_identical_passes() -> None:
    ref = t(1.0, -2.0, 3.0)
    r = check(ref.clone(), ref)
    assert r.status == "ok" and r.ok
    assert r.matched_ratio == 1.0 and r.max_absolute_error == 0.0
    assert r.rel_l2_error == 0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda ref: torch.nn.Parameter(ref.clone()),
        lambda ref: ref.clone().as_subclass(type("Sub", (torch.Tensor,), {})),
        lambda ref: torch.empty(ref.shape, device="meta"),
        lambda ref: ref.tolist(),
        lambda ref: ref.numpy().copy(),
        lambda ref: ref.to_sparse(),
    ],
    ids=["parameter", "subclass", "meta", "list", "numpy", "sparse"],
)
def test_non_plain_tensor_is_type_failure(make: object) -> None:
    ref = t(1.0, 2.0, 3.0)
    r = check(make(ref), ref)  # type: ignore[operator]
    assert r.status == "type", r.message
    assert "'y'" in r.message


def test_fake_tensor_is_type_failure() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    ref = t(1.0, 2.0)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(ref)
    r = check(fake, ref)
    assert r.status == "type" and "FakeTensor" in r.message


def test_shape_checked_before_dtype() -> None:
    ref = t(1.0, 2.0, 3.0)
    r = check(torch.zeros(2, dtype=torch.float16), ref)
    assert r.status == "shape"
    assert "(3,)" in r.message and "(2,)" in r.message


def test_dtype_mismatch() -> None:
    ref = t(1.0, 2.0)
    r = check(ref.to(torch.float16), ref)
    assert r.status == "dtype"
    assert "torch.float32" in r.message and "torch.float16" in r.message


def test_expected_dtype_comes_from_definition_not_reference() -> None:
    ref = t(1.0, 2.0, dtype=torch.float32)
    out = ref.to(torch.bfloat16)
    r = check(out, ref, expected_dtype=torch.bfloat16)
    assert r.status == "ok"


def test_broken_reference_raises() -> None:
    ref = t(1.0, 2.0)
    with pytest.raises(ReferenceMismatch, match="shape"):
        check(ref.clone(), ref, expected_shape=(3,))


# ------------------------------------------------------------------ numerical rules


def test_element_match_is_inclusive_at_threshold() -> None:
    ref = t(1.0, 1.0)
    # atol + rtol*|y| = 0.5 + 0.25 = 0.75, exactly representable
    assert check(t(1.75, 0.25), ref).status == "ok"
    r = check(t(1.75, 1.8), ref)
    assert r.status == "numerical" and r.matched_ratio == 0.5


def test_ratio_exactly_at_required_passes_and_one_below_fails() -> None:
    ref = torch.ones(100)
    out = ref.clone()
    out[0] = 10.0
    tol = Tolerance(max_atol=0.01, max_rtol=0.01, required_matched_ratio=0.99)
    r = check(out, ref, tol)
    assert r.status == "ok" and r.matched_ratio == 0.99
    out[1] = 10.0
    r = check(out, ref, tol)
    assert r.status == "numerical" and r.matched_ratio == 0.98
    assert "98.0000%" in r.message and "99.0000%" in r.message


def test_relative_error_uses_atol_as_floor() -> None:
    ref = t(0.0, 4.0)
    out = t(0.1, 4.0)
    tol = Tolerance(max_atol=0.5, max_rtol=0.0, required_matched_ratio=1.0)
    r = check(out, ref, tol)
    assert r.status == "ok"
    assert r.max_absolute_error == pytest.approx(0.1)
    assert r.max_relative_error == pytest.approx(0.1 / 0.5)


def test_relative_error_with_zero_atol() -> None:
    tol = Tolerance(max_atol=0.0, max_rtol=0.5, required_matched_ratio=0.0)
    r = check(t(0.0, 1.0), t(0.0, 0.0), tol)
    assert r.max_relative_error == math.inf  # 1 / max(0, 0)
    r = check(t(0.0, 3.0), t(0.0, 2.0), tol)
    assert r.max_relative_error == pytest.approx(0.5)


def test_error_cap() -> None:
    ref = torch.zeros(10)
    ref[0] = 1.0
    out = ref.clone()
    out[1] = 2.0  # one element off by 2
    tol = Tolerance(max_atol=0.01, max_rtol=0.01, required_matched_ratio=0.9)
    assert check(out, ref, tol).status == "ok"
    capped = tol.model_copy(update={"max_error_cap": 1.5})
    r = check(out, ref, capped)
    assert r.status == "numerical" and "cap" in r.message
    assert check(out, ref, tol.model_copy(update={"max_error_cap": 2.0})).status == "ok"


def test_all_zero_output_fails_when_reference_is_not() -> None:
    tol = Tolerance(max_atol=1.0, max_rtol=0.0, required_matched_ratio=1.0)
    ref = t(0.5, 0.0, 0.25)  # within atol of zero everywhere
    r = check(torch.zeros(3), ref, tol)
    assert r.status == "numerical" and "all-zero" in r.message
    assert r.matched_ratio == 1.0
    assert check(torch.zeros(3), torch.zeros(3), tol).status == "ok"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_in_output_fails(bad: float) -> None:
    ref = t(1.0, 2.0)
    r = check(t(1.0, bad), ref, Tolerance(required_matched_ratio=0.0))
    assert r.status == "numerical"
    assert r.has_nan == math.isnan(bad) and r.has_inf == math.isinf(bad)
    assert r.max_absolute_error == 0.0  # errors are over finite positions only


def test_non_finite_in_reference_fails() -> None:
    r = check(t(1.0, 2.0), t(1.0, math.nan), Tolerance(required_matched_ratio=0.0))
    assert r.status == "numerical" and r.has_nan


def test_negative_inf_pairs_only_with_allow() -> None:
    ref = t(-math.inf, 1.0)
    out = t(-math.inf, 1.0)
    strict = Tolerance(required_matched_ratio=0.0)
    assert check(out, ref, strict).status == "numerical"
    allow = Tolerance(allow_negative_inf=True)
    r = check(out, ref, allow.model_copy(update={"required_matched_ratio": 1.0}))
    assert r.status == "ok" and r.has_inf and r.matched_ratio == 1.0
    # -inf against a finite value, +inf pairs and NaN are never excused
    for o, y in [(-math.inf, 0.0), (math.inf, math.inf), (-math.inf, math.inf)]:
        r = check(t(o, 1.0), t(y, 1.0), allow)
        assert r.status == "numerical", (o, y)


def test_float64_is_judged_in_float32() -> None:
    ref = torch.tensor([1.0], dtype=torch.float64)
    out = ref + 1e-12  # lost in the float32 cast
    r = check(out, ref, Tolerance(max_atol=0.0, max_rtol=0.0, required_matched_ratio=1.0))
    assert r.status == "ok" and r.max_absolute_error == 0.0


def test_rel_l2_in_float64() -> None:
    ref = t(3.0, 4.0)
    out = t(3.0, 4.5)
    r = check(out, ref)
    assert r.rel_l2_error == pytest.approx(0.5 / 5.0)


# ------------------------------------------------------------------ exact dtypes


def test_exact_dtypes_cover_int_and_bool() -> None:
    assert {torch.bool, torch.int8, torch.int32, torch.int64, torch.uint8} <= EXACT_DTYPES
    assert torch.float32 not in EXACT_DTYPES and torch.bfloat16 not in EXACT_DTYPES


def test_integers_compare_exactly() -> None:
    ref = torch.tensor([1000, 5, 7], dtype=torch.int64)
    out = torch.tensor([1010, 5, 7], dtype=torch.int64)
    tol = Tolerance(max_atol=0.01, max_rtol=0.01, required_matched_ratio=1.0)
    r = check(out, ref, tol)
    assert r.status == "numerical" and r.max_absolute_error == 10.0
    # the official float rules would accept it: 10 <= 0.01 + 0.01*1000
    assert check(out, ref, tol, exact_integers=False).status == "ok"


def test_large_int64_not_rounded() -> None:
    ref = torch.tensor([2**40], dtype=torch.int64)
    out = ref + 1  # identical after a float32 cast
    tol = Tolerance(max_atol=0.0, max_rtol=0.0, required_matched_ratio=1.0)
    assert check(out, ref, tol).status == "numerical"


def test_bool_outputs() -> None:
    ref = torch.tensor([True, False, True, True])
    r = check(torch.tensor([True, False, False, True]), ref, Tolerance())
    assert r.status == "numerical" and r.matched_ratio == 0.75
    assert check(ref.clone(), ref, Tolerance()).status == "ok"
    r = check(torch.zeros(4, dtype=torch.bool), ref, Tolerance(required_matched_ratio=0.0))
    assert r.status == "numerical" and "all-zero" in r.message


# ------------------------------------------------------------------ chunking, layout


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_chunking_gives_the_same_answer(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(5, 11, generator=g)
    out = ref + 0.02 * torch.randn(5, 11, generator=g)
    out[2, 3] = -math.inf
    ref[2, 3] = -math.inf
    tol = Tolerance(max_atol=0.01, max_rtol=0.01, required_matched_ratio=0.5,
                    allow_negative_inf=True)  # fmt: skip
    whole = check(out, ref, tol, chunk_elems=ref.numel())
    part = check(out, ref, tol, chunk_elems=chunk)
    assert part.status == whole.status
    assert part.matched_ratio == whole.matched_ratio
    assert part.max_absolute_error == whole.max_absolute_error
    assert part.max_relative_error == whole.max_relative_error
    assert part.rel_l2_error == pytest.approx(whole.rel_l2_error, rel=1e-12)
    assert 0.0 < whole.matched_ratio < 1.0  # the data exercises both outcomes


def _totals(kind: str, x: torch.Tensor, y: torch.Tensor, tol: Tolerance) -> dict[str, object]:
    acc = cmp._Acc()
    fn = cmp._chunk_float if kind == "fast" else cmp._chunk_float_masked
    fn(x, y, tol, acc)
    return vars(acc)


def _pair(case: str, n: int = 4099) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    y = torch.randn(n, generator=g) * 3
    x = y + torch.randn(n, generator=g) * 0.3
    if case == "zeros":  # zeros on either side, equal values, and 0 - 0
        y[::7], x[::5], x[::11] = 0.0, 0.0, y[::11]
    elif case == "all-zero-output":
        x.zero_()
    elif case == "tiny":  # subnormal and near-zero references
        y[::3] = 1e-40
    elif case in ("nan", "inf", "-inf"):
        x[10], y[20] = float(case), float(case)
    elif case == "overflow":  # finite on both sides, the difference is not
        x[5], y[5] = 3e38, -3e38
    return x, y


@pytest.mark.parametrize("case", ["plain", "zeros", "all-zero-output", "tiny", "nan", "inf",
                                  "-inf", "overflow"])  # fmt: skip
@pytest.mark.parametrize(
    "tol",
    [TOL, Tolerance(max_atol=0.0, max_rtol=0.1, required_matched_ratio=0.9),
     Tolerance(max_atol=1e-3, max_rtol=0.0, required_matched_ratio=0.5),
     Tolerance(max_atol=0.0, max_rtol=0.0, required_matched_ratio=0.0, allow_negative_inf=True)],
)  # fmt: skip
def test_the_finite_fast_path_gives_the_masked_paths_totals_bit_for_bit(
    case: str, tol: Tolerance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_chunk_float`` takes its own path only where every difference is finite, and there
    gives exactly what ``_chunk_float_masked`` (the rules written out over masks) gives."""
    x, y = _pair(case)
    masked = _totals("masked", x, y, tol)
    taken: list[bool] = []
    masked_path = cmp._chunk_float_masked

    def counted(*a: object) -> None:
        taken.append(True)
        masked_path(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(cmp, "_chunk_float_masked", counted)
    assert _totals("fast", x, y, tol) == masked
    assert bool(taken) == (case in ("nan", "inf", "-inf", "overflow"))


def test_non_contiguous_output() -> None:
    ref = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = ref.t().contiguous().t()  # same values, column-major strides
    assert not out.is_contiguous()
    assert check(out, ref).status == "ok"
    assert check(ref.t(), ref, expected_shape=(2, 3)).status == "shape"


def test_empty_tensor_passes() -> None:
    ref = torch.empty(0, 4)
    r = check(torch.empty(0, 4), ref)
    assert r.status == "ok" and r.matched_ratio == 1.0


def test_bad_chunk_size() -> None:
    with pytest.raises(ValueError, match="chunk_elems"):
        check(t(1.0), t(1.0), chunk_elems=0)


# ------------------------------------------------------------------ precision level


def test_precision_level_thresholds() -> None:
    assert precision_level(0.0, torch.float32) is None
    assert precision_level(1e-6, torch.float32) is None
    assert precision_level(1e-5, torch.float32) == "tf32-level"
    assert precision_level(4e-4, torch.float32) == "tf32-level"
    assert precision_level(9e-4, torch.float32) == "tf32-level"
    assert precision_level(1e-3, torch.float32) == "bf16-level"
    assert precision_level(2e-3, torch.float32) == "bf16-level"
    assert precision_level(5e-3, torch.float32) == "bf16-level"
    assert precision_level(5e-3, torch.bfloat16) is None
    with pytest.raises(ValueError):
        precision_level(math.nan, torch.float32)


def test_precision_level_on_real_roundings() -> None:
    g = torch.Generator().manual_seed(1)
    a = torch.randn(64, 256, generator=g, dtype=torch.float64)
    b = torch.randn(256, 64, generator=g, dtype=torch.float64)
    exact = (a @ b).float()

    def level_of(dt: torch.dtype) -> str | None:
        out = (a.to(dt).double() @ b.to(dt).double()).float()
        r = check(out, exact, Tolerance(max_atol=1e9, max_rtol=0.0))
        assert r.rel_l2_error is not None
        return precision_level(r.rel_l2_error, torch.float32)

    def tf32(x: torch.Tensor) -> torch.Tensor:  # keep 10 mantissa bits (round to nearest)
        bits = x.float().view(torch.int32)
        bits = (bits + 0x1000) & ~0x1FFF
        return bits.view(torch.float32).double()

    assert level_of(torch.float32) is None
    tf = (tf32(a) @ tf32(b)).float()
    r = check(tf, exact, Tolerance(max_atol=1e9, max_rtol=0.0))
    assert r.rel_l2_error is not None
    assert precision_level(r.rel_l2_error, torch.float32) == "tf32-level"
    assert level_of(torch.bfloat16) == "bf16-level"
