"""Input generation for one workload: scalars, random tensors, safetensors blobs, custom.

``generate_inputs`` calls ``torch.manual_seed(seed)`` (which seeds CUDA too) and then builds
the inputs in definition order, so the result is a function of (seed, device). Sources:

- ``scalar``: the workload's value cast to the declared kind (float/int/bool); a tensor
  spec (``[]`` or larger) is filled with it.
- ``safetensors``: ``problem_root / path`` at ``tensor_key``, read on the CPU and moved to
  ``device``; shape and dtype must equal the definition's. Absent files raise
  :class:`MissingBlobError` before anything is allocated.
- ``custom``: ``reference.<custom_inputs_entrypoint>(axes_and_scalars, device)``, where
  ``axes_and_scalars`` holds every resolved axis plus the workload's scalar inputs. Every
  declared input must be returned; extra keys are ignored (and noted).
- ``random`` (or absent from the workload): a Python scalar for ``shape: null`` (float:
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

Guesses that matter (masks, SSM ranges, index bounds, custom extras or mismatches) are
recorded in ``GeneratedInputs.notes``. Not covered: generating the flashinfer-trace index
blobs of safetensors workloads (future work), device placement beyond ``device``.
"""

from __future__ import annotations

import linecache
import math
import traceback
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelarc.errors import KernelArcError
from kernelarc.problem.axes import AxisError, resolve_axes, resolve_shape
from kernelarc.problem.lowbit import DTYPE_BYTES, FP4_DTYPES
from kernelarc.problem.schema import (
    CustomInput,
    Definition,
    DType,
    SafetensorsInput,
    ScalarInput,
    TensorSpec,
    Workload,
)

if TYPE_CHECKING:
    import torch


class InputGenerationError(KernelArcError):
    """Inputs of a workload cannot be produced; the message names problem, workload, input."""


class MissingBlobError(InputGenerationError):
    """A workload reads a safetensors file that is not on disk."""


def torch_dtype(dt: DType) -> torch.dtype:
    """The torch dtype of a definition dtype. ``float4_e2m1`` -> ``uint8`` (one code per
    byte); ``float4_e2m1fn_x2`` -> ``torch.float4_e2m1fn_x2`` (error if torch lacks it)."""
    from kernelarc.problem.lowbit import LowBitError, torch_dtype_of

    try:
        return torch_dtype_of(dt)
    except LowBitError as e:
        raise InputGenerationError(str(e)) from e


def load_reference_module(
    definition: Definition, *, name: str = "kernelarc_reference"
) -> types.ModuleType:
    """Compile ``definition.reference`` into a fresh module (not put in ``sys.modules``).

    The source is registered in :mod:`linecache` under ``<reference:NAME>`` so that
    tracebacks show its lines."""
    filename = f"<reference:{definition.name}>"
    source = definition.reference
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    try:
        code = compile(source, filename, "exec")
        exec(code, module.__dict__)
    except Exception as e:
        raise InputGenerationError(
            f"{definition.name}: the reference does not load ({type(e).__name__}: {e})\n"
            + traceback.format_exc()
        ) from e
    return module


@dataclass
class GeneratedInputs:
    values: dict[str, Any]
    """Input name -> tensor or Python scalar, in definition input order."""
    notes: list[str] = field(default_factory=list)


def estimate_input_bytes(definition: Definition, workload: Workload) -> int:
    """Bytes of the declared tensor inputs of a workload (scalars count 0), computed from
    shapes and dtypes without allocating. For custom workloads this is the declared size;
    the entrypoint may allocate more while it builds them."""
    env = resolve_axes(definition, workload)
    total = 0
    for spec in definition.inputs.values():
        shape = resolve_shape(spec.shape, env)
        if shape is not None:
            total += math.prod(shape) * DTYPE_BYTES[spec.dtype]
    return total


def generate_inputs(
    definition: Definition,
    workload: Workload,
    *,
    device: str | torch.device,
    seed: int,
    problem_root: Path | None,
    reference_module: types.ModuleType | None = None,
) -> GeneratedInputs:
    """The inputs of one workload on ``device``, deterministic for (seed, device)."""
    import torch

    dev = torch.device(device)
    torch.manual_seed(seed)
    where = f"{definition.name} workload {workload.uuid}"
    try:
        env = resolve_axes(definition, workload)
    except AxisError as e:
        raise InputGenerationError(f"{where}: {e}") from e
    notes: list[str] = []
    if workload.is_custom:
        module = reference_module or load_reference_module(definition)
        return GeneratedInputs(_custom_inputs(definition, workload, env, dev, module, notes), notes)
    for name, blob in workload.inputs.items():  # fail on absent blobs before allocating
        if isinstance(blob, SafetensorsInput):
            try:
                _blob_path(blob, problem_root, name)
            except MissingBlobError as e:
                raise MissingBlobError(f"{where}: {e}") from e
    ctx = _Ctx(env, dev, notes, frozenset(definition.inputs))
    values: dict[str, Any] = {}
    for name, spec in definition.inputs.items():
        src = workload.inputs.get(name)
        shape = resolve_shape(spec.shape, env)
        try:
            if isinstance(src, ScalarInput):
                values[name] = _scalar(src.value, spec, shape, dev)
            elif isinstance(src, SafetensorsInput):
                values[name] = _from_safetensors(src, spec, shape, dev, problem_root, name)
            elif isinstance(src, CustomInput):  # excluded by Workload's validator
                raise InputGenerationError("custom inputs mixed with others")
            else:
                values[name] = _random(name, spec, shape, ctx)
        except InputGenerationError as e:
            raise type(e)(f"{where}: input {name!r}: {e}") from e
        except Exception as e:
            raise InputGenerationError(
                f"{where}: input {name!r} (shape {shape}, {spec.dtype.value}) failed: "
                f"{type(e).__name__}: {e}"
            ) from e
    return GeneratedInputs(values, notes)


# ---------------------------------------------------------------- scalars, blobs, custom


def _scalar(
    value: bool | int | float, spec: TensorSpec, shape: tuple[int, ...] | None, dev: Any
) -> Any:
    import torch

    if spec.dtype == DType.bool:
        if value not in (0, 1):
            raise InputGenerationError(f"scalar {value!r} is not a bool")
        cast: bool | int | float = bool(value)
    elif spec.dtype.is_float:
        cast = float(value)
    else:
        if isinstance(value, float) and not value.is_integer():
            raise InputGenerationError(f"scalar {value!r} is not an integer ({spec.dtype.value})")
        cast = int(value)
    if shape is None:
        return cast
    if spec.dtype in FP4_DTYPES:
        raise InputGenerationError("a scalar value cannot fill an FP4 tensor")
    return torch.full(shape, cast, dtype=torch_dtype(spec.dtype), device=dev)


def _blob_path(src: SafetensorsInput, root: Path | None, name: str) -> Path:
    path = Path(root) / src.path if root is not None else None
    if path is None or not path.is_file():
        at = f"under {root}" if root is not None else "(no problem_root was given)"
        raise MissingBlobError(
            f"input {name!r} reads safetensors file {src.path} (key {src.tensor_key!r}), "
            f"which is absent {at}. This workload needs the flashinfer-trace blobs: put them "
            "in the problem directory at that path, or use a generator for these index "
            "tensors (future work)."
        )
    return path


def _from_safetensors(
    src: SafetensorsInput,
    spec: TensorSpec,
    shape: tuple[int, ...] | None,
    dev: Any,
    root: Path | None,
    name: str,
) -> Any:
    path = _blob_path(src, root, name)
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            keys = list(f.keys())
            if src.tensor_key not in keys:
                raise InputGenerationError(
                    f"{path} has no tensor {src.tensor_key!r} (it has {sorted(keys)})"
                )
            tensor = f.get_tensor(src.tensor_key)
    except InputGenerationError:
        raise
    except Exception as e:
        raise InputGenerationError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    want = torch_dtype(spec.dtype)
    got_shape = tuple(tensor.shape)
    if tensor.dtype != want or (shape if shape is not None else ()) != got_shape:
        raise InputGenerationError(
            f"{path}[{src.tensor_key!r}] is {tensor.dtype} {list(got_shape)}, but the "
            f"definition declares {spec.dtype.value} {list(shape or [])}"
        )
    return tensor.item() if shape is None else tensor.to(dev)


def _custom_inputs(
    definition: Definition,
    workload: Workload,
    env: dict[str, int],
    dev: Any,
    module: types.ModuleType,
    notes: list[str],
) -> dict[str, Any]:
    import torch

    ep = definition.custom_inputs_entrypoint
    where = f"{definition.name} workload {workload.uuid}"
    if not ep:
        raise InputGenerationError(
            f"{where} has custom inputs but the definition names no custom_inputs_entrypoint"
        )
    fn = getattr(module, ep, None)
    if not callable(fn):
        raise InputGenerationError(f"{where}: the reference module has no function {ep!r}")
    args: dict[str, Any] = dict(env)
    args.update(workload.scalar_inputs())
    try:
        out = fn(args, dev)
    except Exception as e:
        raise InputGenerationError(
            f"{where}: {ep}(axes_and_scalars, {dev}) raised {type(e).__name__}: {e}\n"
            + traceback.format_exc()
        ) from e
    if not isinstance(out, Mapping):
        raise InputGenerationError(f"{where}: {ep} returned {type(out).__name__}, not a dict")
    missing = [n for n in definition.inputs if n not in out]
    if missing:
        raise InputGenerationError(f"{where}: {ep} did not return inputs {missing}")
    extra = sorted(str(k) for k in out if k not in definition.inputs)
    if extra:
        notes.append(f"{ep} returned extra keys {extra} (ignored)")
    values = {n: out[n] for n in definition.inputs}
    for n, spec in definition.inputs.items():
        v, shape = values[n], resolve_shape(spec.shape, env)
        if isinstance(v, torch.Tensor):
            if shape is not None and tuple(v.shape) != shape:
                notes.append(f"{n}: {ep} returned shape {list(v.shape)}, declared {list(shape)}")
            if v.dtype != torch_dtype(spec.dtype):
                notes.append(f"{n}: {ep} returned {v.dtype}, declared {spec.dtype.value}")
            if v.device.type != dev.type:
                notes.append(f"{n}: {ep} returned a tensor on {v.device}, not {dev}")
    return values


# ---------------------------------------------------------------- random


@dataclass(frozen=True)
class _Ctx:
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


def _random(name: str, spec: TensorSpec, shape: tuple[int, ...] | None, ctx: _Ctx) -> Any:
    import torch

    from kernelarc.problem import lowbit

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
    name: str, syms: list[str], shape: tuple[int, ...], ctx: _Ctx, lowest: float, scaled: bool
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
    name: str, syms: list[str], shape: tuple[int, ...], ctx: _Ctx, lowest: float
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


def _int_tensor(name: str, dt: DType, shape: tuple[int, ...], ctx: _Ctx, dev: Any) -> torch.Tensor:
    import torch

    env, notes = ctx.env, ctx.notes
    target = torch_dtype(dt)
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
