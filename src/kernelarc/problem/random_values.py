"""Random values for one input, by dtype and by the input's name (the official generator's
heuristics, written for this project). Used by :func:`kernelarc.problem.inputs.generate_inputs`
after it has seeded torch; deterministic for a given seed and device.

Rules: a Python scalar for ``shape: null`` (float:
  uniform [0, 1); int: as int tensors below; bool: 0/1), else a tensor chosen by dtype and
  by the input's name. Names are split on ``_`` into lower-case tokens with trailing digits
  dropped (``layer_norm1_weight`` -> layer, norm, weight). Float rules, first match wins:

  1. first token ``grad``: randn (gradients are unconstrained).
  2. exact SSM/gate names: ``A_log`` -> log U[1, 16]; ``A`` -> -U[1, 16] (= -exp(A_log)),
     only when the inputs also include ``B``, ``C`` and ``D`` or ``dt`` (else a GEMM's A);
     ``A_cumsum`` -> cumulative sum over the last dim of -U[0, 1); ``g`` -> -U[0, 1);
     ``dt`` -> log-uniform in [1e-3, 1e-1]; ``beta`` -> sigmoid(randn), in (0, 1).
  3. norm parameters: a norm token (``ln gn bn grn rms`` or one ending in ``norm``) before
     a last token ``weight/gamma/scale`` -> ones, or ``bias/beta`` -> zeros.
  4. masks (last token ends in ``mask``/``masks``: ``attention_mask``, not ``mask_tokens``):
     causal (0 on/below the diagonal, ``finfo.min`` above, bottom-right aligned) when the
     last two dims are the same axis name, or the tensor is >= 3-D with 1 < rows <= cols;
     otherwise a {0, 1} mask.
  5. token ``cos`` / ``sin``: cos / sin of randn clamped to [-pi, pi].
  6. softmax outputs (token ``softmax probs prob``, or the name contains ``attn_weights
     attention_weights attn_probs p_attn routing_weights``): softmax of randn, last dim.
  7. positive quantities (token ``rstd invstd std stddev var variance scale scales eps
     epsilon temperature sigma``): \\|randn\\| + 0.1.
  8. weight matrices (>= 2-D, a token ``weight/weights`` or last token ``proj``):
     randn / sqrt(fan_in), fan_in = shape[-1] up to 3-D (linear, expert stacks) and
     prod(shape[1:]) from 4-D (conv kernels).
  9. anything else: randn.

  FP8 (e4m3fn/e5m2): the value above clamped to [-2, 2], then cast (masks keep the
  format's ``finfo.min``). FP4x2: the value above without the 1/sqrt(fan_in) factor (it
  would round every weight to 0 in E2M1), quantized and packed (see ``lowbit``); the
  unpacked ``float4_e2m1`` is ``uint8`` storage with one code per byte.
  bool -> randint(0, 2). Integers, first match wins:

  a. ``indptr`` token or ``cu_seqlens``: non-decreasing offsets from 0 to a total axis
     (``total_q``, ``num_kv_indices``, ...) when one is found, else steps of 1..16.
  b. a mask (as in 4): {0, 1}.
  c. index-like (token ``ids id idx index indices pos``, ``position`` in the name, ``topk``
     token, or a name ending in ``_experts``): randint(0, bound). The bound comes from an
     axis by topic: experts (``num_experts``...; top-k rows are distinct when they fit),
     positions (``max_position_embeddings``, then cache/seq axes), pages (``num_pages``),
     token ids (a ``vocab`` axis); else 1024, noted as a guess.
  d. count-like (token ``count counts num len lens length lengths seqlens``, or ``_per_``
     in the name): [0, 1024).
  e. by dtype: int8 [-128, 128), uint8 [0, 256), others [-1024, 1024).

"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelarc.problem import lowbit
from kernelarc.problem.lowbit import FP4_DTYPES
from kernelarc.problem.schema import DType, TensorSpec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RandomContext:
    env: Mapping[str, int]
    dev: Any
    notes: list[str]
    siblings: frozenset[str]
    """Names of all inputs of the definition (some rules look at the other inputs)."""


def _tokens(name: str) -> list[str]:
    return [t.rstrip("0123456789") for t in name.lower().split("_") if t.rstrip("0123456789")]


def _is_mask(name: str) -> bool:
    toks = _tokens(name)
    return bool(toks) and toks[-1].endswith(("mask", "masks"))


def random_value(
    name: str, spec: TensorSpec, shape: tuple[int, ...] | None, ctx: RandomContext
) -> Any:
    import torch

    if shape is None:
        if spec.dtype == DType.bool:
            return bool(torch.randint(0, 2, ()).item())
        if spec.dtype.is_float:
            return float(torch.rand(()).item())
        return int(_int_tensor(name, spec.dtype, (), ctx, torch.device("cpu")).item())
    if spec.dtype == DType.bool:
        return torch.randint(0, 2, shape, device=ctx.dev).to(torch.bool)
    if not spec.dtype.is_float:
        return _int_tensor(name, spec.dtype, shape, ctx, ctx.dev)
    lowest = lowbit.lowest_value(spec.dtype)
    vshape = lowbit.value_shape(spec.dtype, shape)
    # FP4 keeps unit-scale weights: 1/sqrt(fan_in) would round them all to 0 in E2M1.
    scaled = spec.dtype not in FP4_DTYPES
    vals = _float_values(name, spec.shape or [], vshape, ctx, lowest, scaled)
    return lowbit.from_float32(vals, spec.dtype, clamp_fp8=not _is_mask(name))


_NORM_TOKENS = {"ln", "gn", "bn", "grn", "rms"}
_POSITIVE = {"rstd", "invstd", "std", "stddev", "var", "variance", "scale", "scales", "eps",
             "epsilon", "temperature", "sigma"}  # fmt: skip
_SOFTMAX_PHRASES = ("attn_weights", "attention_weights", "attn_probs", "p_attn", "routing_weights")
_SSM = {"a_log": "log U[1,16]", "a_cumsum": "cumsum of -U[0,1)", "A": "-U[1,16]",
        "g": "-U[0,1)", "dt": "log-uniform [1e-3, 1e-1]", "beta": "sigmoid(randn)"}  # fmt: skip


def _float_values(
    name: str,
    syms: list[str],
    shape: tuple[int, ...],
    ctx: RandomContext,
    lowest: float,
    scaled: bool,
) -> torch.Tensor:
    """Float32 values for a random float input (see the module docstring for the rules)."""
    import torch

    f32, dev = torch.float32, ctx.dev
    toks, lname = _tokens(name), name.lower()

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return torch.rand(shape, dtype=f32, device=dev) * (hi - lo) + lo

    def randn() -> torch.Tensor:
        return torch.randn(shape, dtype=f32, device=dev)

    if toks and toks[0] == "grad":
        return randn()
    key = lname if lname in ("a_log", "a_cumsum") else name
    if key == "A" and not ({"B", "C"} <= ctx.siblings and {"D", "dt"} & ctx.siblings):
        key = ""  # a GEMM's A, not a state-space decay
    if key in _SSM:
        ctx.notes.append(f"{name}: SSM/gate input, {_SSM[key]}")
        if key == "a_log":
            return uniform(1.0, 16.0).log()
        if key == "a_cumsum":
            return (-uniform(0.0, 1.0)).cumsum(-1) if shape else -uniform(0.0, 1.0)
        if key in ("A", "g"):
            return uniform(-16.0, -1.0) if key == "A" else -uniform(0.0, 1.0)
        if key == "dt":
            return uniform(math.log(1e-3), math.log(1e-1)).exp()
        return torch.sigmoid(randn())
    if len(toks) >= 2 and any(t in _NORM_TOKENS or t.endswith("norm") for t in toks[:-1]):
        if toks[-1] in ("weight", "gamma", "scale"):
            return torch.ones(shape, dtype=f32, device=dev)
        if toks[-1] in ("bias", "beta"):
            return torch.zeros(shape, dtype=f32, device=dev)
    if _is_mask(name):
        return _mask(name, syms, shape, ctx, lowest)
    if "cos" in toks or "sin" in toks:
        angle = randn().clamp(-math.pi, math.pi)
        return angle.cos() if "cos" in toks else angle.sin()
    if shape and (
        {"softmax", "probs", "prob"} & set(toks) or any(p in lname for p in _SOFTMAX_PHRASES)
    ):
        return torch.softmax(randn(), dim=-1)
    if _POSITIVE & set(toks):
        return randn().abs() + 0.1
    is_weight = {"weight", "weights"} & set(toks) or toks[-1:] == ["proj"]
    if len(shape) >= 2 and is_weight and scaled:
        fan_in = shape[-1] if len(shape) <= 3 else math.prod(shape[1:])
        return randn() / math.sqrt(max(fan_in, 1))
    return randn()


def _mask(
    name: str, syms: list[str], shape: tuple[int, ...], ctx: RandomContext, lowest: float
) -> torch.Tensor:
    import torch

    rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (0, 0)
    same_axis = len(syms) >= 2 and syms[-1] == syms[-2]
    if len(shape) >= 2 and (same_axis or (len(shape) >= 3 and 1 < rows <= cols)):
        ctx.notes.append(f"{name}: causal additive mask over its last two dims ({rows}x{cols})")
        keep = torch.ones(rows, cols, dtype=torch.bool, device=ctx.dev).tril(cols - rows)
        mask = torch.zeros(rows, cols, dtype=torch.float32, device=ctx.dev)
        return mask.masked_fill(~keep, lowest).expand(shape).contiguous()
    ctx.notes.append(f"{name}: binary {{0, 1}} mask")
    return torch.randint(0, 2, shape, device=ctx.dev).to(torch.float32)


# ---------------------------------------------------------------- integers

_INDEX_TOKENS = {"ids", "id", "idx", "index", "indices", "pos", "topk"}
_COUNT_TOKENS = {"count", "counts", "num", "len", "lens", "length", "lengths", "seqlens"}
_EXPERT_AXES = ("num_experts", "n_routed_experts", "num_routed_experts", "n_experts",
                "num_local_experts")  # fmt: skip
_POSITION_AXES = ("max_position_embeddings", "max_seq_len", "max_seqlen", "max_cache_len")


def _find_axis(
    env: Mapping[str, int],
    exact: tuple[str, ...],
    contains: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
) -> tuple[str, int] | None:
    for n in exact:
        if env.get(n, 0) > 0:
            return n, env[n]
    for n, v in env.items():
        low = n.lower()
        if v > 0 and any(c in low for c in contains) and not any(x in low for x in exclude):
            return n, v
    return None


def _int_tensor(
    name: str, dt: DType, shape: tuple[int, ...], ctx: RandomContext, dev: Any
) -> torch.Tensor:
    import torch

    env, notes = ctx.env, ctx.notes
    target = lowbit.torch_dtype_of(dt)
    hi_limit = int(torch.iinfo(target).max) + 1
    toks, lname = _tokens(name), name.lower()
    if ("indptr" in toks or "cu_seqlens" in lname) and len(shape) == 1:
        return _offsets(name, shape[0], env, dev, notes).to(target)
    if _is_mask(name):
        return torch.randint(0, 2, shape, device=dev).to(target)
    if _INDEX_TOKENS & set(toks) or "position" in lname or lname.endswith("_experts"):
        found: tuple[str, int] | None
        if "expert" in lname or "topk" in toks or "top_k" in lname:
            ex = ("per", "top", "dim", "size", "hidden", "intermediate", "group")
            found = _find_axis(env, _EXPERT_AXES, ("expert",), ex)
        elif "position" in lname or "pos" in toks:
            found = _find_axis(env, _POSITION_AXES, ("cache_len", "cache_seq", "current_seq"))
            found = found or _find_axis(env, (), ("seq",), ("num_seq", "seqs"))
        elif "page" in lname or "kv_indices" in lname:
            found = _find_axis(env, ("num_pages", "total_pages", "max_num_pages"), ("page",),
                               ("size", "per"))  # fmt: skip
        elif "token" in lname or "input_ids" in lname:
            found = _find_axis(env, ("vocab_size",), ("vocab",))
        else:
            found = None
        if found is None:
            notes.append(f"{name}: index with no axis to bound it, guessed [0, 1024)")
            bound = 1024
        else:
            notes.append(f"{name}: index in [0, {found[1]}) (axis {found[0]})")
            bound = found[1]
        bound = min(bound, hi_limit)
        if "expert" in lname or "topk" in toks:
            if shape and 1 <= shape[-1] <= bound:  # distinct experts per row, like top-k
                scores = torch.rand((*shape[:-1], bound), device=dev)
                return scores.argsort(dim=-1)[..., : shape[-1]].to(target)
        return torch.randint(0, bound, shape, device=dev).to(target)
    if _COUNT_TOKENS & set(toks) or "_per_" in lname:
        return torch.randint(0, min(1024, hi_limit), shape, device=dev).to(target)
    if dt == DType.int8:
        return torch.randint(-128, 128, shape, device=dev).to(target)
    if dt == DType.uint8:
        return torch.randint(0, 256, shape, device=dev).to(target)
    return torch.randint(-1024, 1024, shape, device=dev).to(target)


def _offsets(
    name: str, length: int, env: Mapping[str, int], dev: Any, notes: list[str]
) -> torch.Tensor:
    """Non-decreasing offsets ``[0, ..., total]``: ``length`` entries, ``length - 1`` segments."""
    import torch

    lname = name.lower()
    if lname.startswith("qo"):
        found = _find_axis(env, ("total_q", "total_qo", "num_qo_tokens", "total_tokens"))
    elif "kv" in lname:
        found = _find_axis(env, ("num_kv_indices", "total_kv", "total_kv_tokens"))
    else:
        found = _find_axis(env, ("total_tokens", "total_seq_len"), ("total",))
    if length <= 1:
        return torch.zeros(length, dtype=torch.int64, device=dev)
    if found is None:
        notes.append(f"{name}: offsets with no total axis, guessed segment lengths 1..16")
        steps = torch.randint(1, 17, (length - 1,), device=dev)
        return torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), steps.cumsum(0)])
    total = found[1]
    notes.append(f"{name}: offsets from 0 to {total} (axis {found[0]}), random cut points")
    cuts = torch.randint(0, total + 1, (length - 2,), device=dev).sort().values
    ends = torch.tensor([0, total], dtype=torch.int64, device=dev)
    return torch.cat([ends[:1], cuts.to(torch.int64), ends[1:]])
