"""Input generation for one workload: scalars, random tensors, safetensors blobs, custom.

``generate_inputs`` calls ``torch.manual_seed(seed)`` (which seeds CUDA too) and then builds
the inputs in definition order, so the result is a function of (seed, device). Sources:

- ``scalar``: the workload's value cast to the declared kind (float/int/bool); a tensor
  spec (``[]`` or larger) is filled with it.
- ``safetensors``: ``problem_root / path`` at ``tensor_key``, read on the CPU and moved to
  ``device``; shape and dtype must equal the definition's. Absent files: generated
  stand-ins (:mod:`kernelarc.problem.indices`, noted) where the structure is known, else
  :class:`MissingBlobError` before anything is allocated.
- ``custom``: ``reference.<custom_inputs_entrypoint>(axes_and_scalars, device)``, where
  ``axes_and_scalars`` holds every resolved axis plus the workload's scalar inputs. Every
  declared input must be returned; extra keys are ignored (and noted).
- ``random`` (or absent from the workload): chosen by dtype and by the input's name, see
  :mod:`kernelarc.problem.random_values`.

Guesses that matter (masks, SSM ranges, index bounds, custom extras or mismatches) are
recorded in ``GeneratedInputs.notes``. Not covered: generating the flashinfer-trace index
blobs of safetensors workloads beyond what :mod:`kernelarc.problem.indices` infers (absent
blobs go there), device placement beyond ``device``.
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

from kernelarc.errors import InputGenerationError, MissingBlobError
from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.expressions import AxisError
from kernelarc.problem.indices import plan_missing_blobs
from kernelarc.problem.lowbit import DTYPE_BYTES, FP4_DTYPES, LowBitError, torch_dtype_of
from kernelarc.problem.random_values import RandomContext, random_value
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


def torch_dtype(dt: DType) -> torch.dtype:
    """The torch dtype of a definition dtype. ``float4_e2m1`` -> ``uint8`` (one code per
    byte); ``float4_e2m1fn_x2`` -> ``torch.float4_e2m1fn_x2`` (error if torch lacks it)."""
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
    return _declared_bytes(definition.inputs, definition, workload)


def estimate_output_bytes(definition: Definition, workload: Workload) -> int:
    """Bytes of a workload's declared outputs, from shapes and dtypes without allocating."""
    return _declared_bytes(definition.outputs, definition, workload)


def _declared_bytes(specs: Mapping[str, Any], definition: Definition, workload: Workload) -> int:
    env = resolve_axes(definition, workload)
    total = 0
    for spec in specs.values():
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
    missing: dict[str, str] = {}  # absent blobs are decided on before allocating
    for name, blob in workload.inputs.items():
        if isinstance(blob, SafetensorsInput):
            try:
                _blob_path(blob, problem_root, name)
            except MissingBlobError as e:
                missing[name] = str(e)
    plan = None
    if missing:  # generated stand-ins (problem/indices.py), or MissingBlobError saying why not
        on_disk = frozenset(workload.inputs) - frozenset(missing)
        plan = plan_missing_blobs(definition, env, missing, on_disk=on_disk, seed=seed, where=where)
    ctx = RandomContext(env, dev, notes, frozenset(definition.inputs))
    values: dict[str, Any] = {}
    for name, spec in definition.inputs.items():
        src = workload.inputs.get(name)
        shape = resolve_shape(spec.shape, env)
        try:
            if plan is not None and name in plan.names:
                values[name] = plan.value(name, spec, shape, ctx)
            elif isinstance(src, ScalarInput):
                values[name] = _scalar(src.value, spec, shape, dev)
            elif isinstance(src, SafetensorsInput):
                values[name] = _from_safetensors(src, spec, shape, dev, problem_root, name)
            elif isinstance(src, CustomInput):  # excluded by Workload's validator
                raise InputGenerationError("custom inputs mixed with others")
            else:
                values[name] = random_value(name, spec, shape, ctx)
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
            f"which is absent {at} (put the flashinfer-trace blobs in the problem directory "
            "at that path)."
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
