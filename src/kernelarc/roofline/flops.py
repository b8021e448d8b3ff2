"""FLOPs and bytes of one workload, from its definition and reference.

**Flops** are counted by running the reference under our own ``TorchDispatchMode`` that calls
the formulas of ``torch.utils.flop_counter.flop_registry`` (the ones ``FlopCounterMode``
uses: mm, bmm, addmm, baddbmm, ``_scaled_mm``, convolutions, SDPA/flash/efficient
attention) and attributes each op's flops to a dtype class from its operand dtypes:
float64 → fp64, float32 → fp32 (the reference computes in fp32, so we say so; how fp32 is
*charged* is a convention of ``score``), float16/bfloat16 → bf16, float8 and int8/uint8 →
fp8, ``float4_e2m1fn_x2`` → fp4; mixed operands take the widest class. Packed FP4 operands
hold two values per element, so the registry's count (which sees the packed K) is doubled.
Elementwise ops, reductions, softmax, etc. are *not* counted: their cost is covered by the
bandwidth term.

**Bytes** = every tensor input read once + every output written once, from the definition's
shapes and dtype sizes (``float4_e2m1fn_x2``: 1 byte per element of the packed tensor; the
unpacked ``float4_e2m1`` is stored one code per byte; Python scalars: 0). Intermediates are
not counted (a fused kernel keeps them on chip).

**Execution.** By default the inputs are meta tensors built from the definition's shapes
(real shapes cost nothing); tensors a reference puts on ``cuda`` are redirected to the
counting device. When the meta run fails (data-dependent ops such as ``nonzero`` or
``.item()``), the reference is re-run on real CPU tensors if the inputs total at most
``cpu_limit_bytes`` (64 MiB) and none is packed FP4 (no CPU kernels), then (with
``gpu_fallback``, for callers on a CUDA machine) on real GPU tensors in a spawned child
process (:func:`run_counted_in_child`: the caller keeps no GPU memory), else on meta tensors
with every data-dependent scalar read replaced by a placeholder (1 / 1.0 / True; recorded in
``notes``); when that fails too, the cost has ``flops_by_class=None`` and a ``reason``.
Real-tensor inputs come from ``problem.inputs.generate_inputs`` (seed 200; safetensors
inputs are generated, not loaded); data-dependent counts (e.g. MoE routing) reflect those
values. Not covered: higher-order ops (``cond``, flex attention), Triton kernels called by a
reference. See ``docs/ROOFLINE.md``. torch is imported by the functions that count, so
importing this module stays cheap.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.inputs import generate_inputs
from kernelarc.problem.lowbit import DTYPE_BYTES, torch_dtype_of
from kernelarc.problem.schema import (
    Definition,
    DType,
    RandomInput,
    SafetensorsInput,
    TensorSpec,
    Workload,
)

if TYPE_CHECKING:
    import torch

CPU_LIMIT_BYTES = 64 * 2**20
#: Seed of real-tensor runs (the official generator's seed).
SEED = 200
Method = Literal["meta", "cpu", "cuda", "meta-placeholders", "none"]

#: Width order of dtype classes: a mixed-operand op runs at its widest operand's rate.
_CLASS_RANK = {"fp4": 0, "fp8": 1, "bf16": 2, "tf32": 3, "fp32": 4, "fp64": 5}
_OPERANDS: dict[str, tuple[int, ...]] = {
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "convolution_backward": (0, 1, 2),
}
_DEFAULT_OPERANDS = (0, 1, 2)
_ATTENTION_PREFIXES = ("_scaled_dot_product", "_flash_attention", "_efficient_attention")


class OpCount(BaseModel):
    """Flops of one (op, dtype class) pair, summed over its calls."""

    op: str
    dtype_class: str
    calls: int
    flops: float


class WorkloadCost(BaseModel):
    """What a workload must compute and move: the inputs of a roofline bound."""

    definition: str
    workload: str
    axes: dict[str, int]
    flops_by_class: dict[str, float] | None
    """Flops per dtype class; ``None`` when the reference could not be counted."""
    bytes: int
    input_bytes: int
    output_bytes: int
    bytes_by_tensor: dict[str, int] = Field(default_factory=dict)
    ops: list[OpCount] = Field(default_factory=list)
    method: Method
    reason: str | None = None
    """Why flops are unknown (``method == "none"``)."""
    notes: list[str] = Field(default_factory=list)

    @property
    def flops(self) -> float | None:
        return None if self.flops_by_class is None else float(sum(self.flops_by_class.values()))


def dtype_class(dtype: torch.dtype) -> str:
    """The dtype class whose rate a matmul operand of this dtype runs at."""
    import torch

    if dtype == torch.float64:
        return "fp64"
    if dtype == torch.float32:
        return "fp32"
    if dtype in (torch.float16, torch.bfloat16):
        return "bf16"
    if dtype == torch.float4_e2m1fn_x2:
        return "fp4"
    if dtype.itemsize == 1:  # float8 variants, int8, uint8
        return "fp8"
    return "fp32"  # wider integers have no tensor-core path


def tensor_bytes(definition: Definition, env: dict[str, int]) -> tuple[dict[str, int], int, int]:
    """Bytes of each tensor input and output (prefixed ``in:`` / ``out:``), and the two sums."""
    sizes: dict[str, int] = {}
    totals = [0, 0]
    for i, (prefix, specs) in enumerate((("in", definition.inputs), ("out", definition.outputs))):
        for name, spec in specs.items():
            shape = resolve_shape(spec.shape, env)
            if shape is None:
                continue
            n = 1
            for d in shape:
                n *= d
            sizes[f"{prefix}:{name}"] = n * DTYPE_BYTES[spec.dtype]
            totals[i] += n * DTYPE_BYTES[spec.dtype]
    return sizes, totals[0], totals[1]


def _classify(op: str, args: tuple[Any, ...]) -> tuple[str, float]:
    import torch

    idx = _OPERANDS.get(op, _DEFAULT_OPERANDS if op.startswith(_ATTENTION_PREFIXES) else (0, 1))
    operands = [args[i] for i in idx if i < len(args) and isinstance(args[i], torch.Tensor)]
    if not operands:
        operands = [a for a in args if isinstance(a, torch.Tensor)]
    classes = [dtype_class(t.dtype) for t in operands] or ["fp32"]
    packed_fp4 = any(t.dtype == torch.float4_e2m1fn_x2 for t in operands)
    return max(classes, key=_CLASS_RANK.__getitem__), 2.0 if packed_fp4 else 1.0


def _device_redirect(device: str) -> Any:
    """A TorchFunctionMode that moves tensors a reference puts on ``cuda`` to ``device``."""
    import torch
    from torch.overrides import TorchFunctionMode

    target = torch.device(device)

    def is_cuda(d: Any) -> bool:
        return (
            isinstance(d, str | torch.device)
            and torch.device(d).type == "cuda"
            and target.type != "cuda"
        )

    class _Redirect(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = dict(kwargs or {})
            if is_cuda(kwargs.get("device")):
                kwargs["device"] = target
            if func is torch.Tensor.cuda:
                return args[0].to(target)
            if func is torch.Tensor.to and len(args) > 1 and is_cuda(args[1]):
                args = (args[0], target, *args[2:])
            return func(*args, **kwargs)

    return _Redirect()


def _counter_mode(placeholders: bool) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    scalar_read = torch.ops.aten._local_scalar_dense.default

    class _Counter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: dict[tuple[str, str], list[float]] = {}
            self.placeholder_reads = 0
            self.not_decomposable: set[Any] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if placeholders and func is scalar_read and args[0].device.type == "meta":
                self.placeholder_reads += 1
                dt = args[0].dtype
                return True if dt == torch.bool else (1.0 if dt.is_floating_point else 1)
            packet = func._overloadpacket
            if (
                packet not in flop_registry
                and func is not torch.ops.prim.device.default
                and func not in self.not_decomposable
            ):
                with self:
                    r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
                self.not_decomposable.add(func)
            out = func(*args, **kwargs)
            if packet in flop_registry:
                name = packet.__name__
                flops = flop_registry[packet](*args, **kwargs, out_val=out)
                cls, factor = _classify(name, args)
                slot = self.counts.setdefault((name, cls), [0, 0.0])
                slot[0] += 1
                slot[1] += float(flops) * factor
            return out

    return _Counter()


def _reference_module(definition: Definition) -> types.ModuleType:
    module = types.ModuleType(f"kernelarc_reference_{definition.name}")
    code = compile(definition.reference, f"<reference of {definition.name}>", "exec")
    exec(code, module.__dict__)
    return module


def _placeholder_scalar(spec: TensorSpec) -> bool | int | float:
    if spec.dtype == DType.bool:
        return False
    return 0.5 if spec.dtype.is_float else 1


def _generated_inputs(
    definition: Definition,
    workload: Workload,
    device: str,
    module: types.ModuleType,
    notes: list[str],
) -> list[Any]:
    """Real inputs from ``problem.inputs.generate_inputs`` (it makes valid index tensors);
    safetensors inputs are generated instead of loaded."""
    blobs = [n for n, s in workload.inputs.items() if isinstance(s, SafetensorsInput)]
    if blobs:
        inputs = {n: RandomInput() if n in blobs else s for n, s in workload.inputs.items()}
        workload = workload.model_copy(update={"inputs": inputs})
        notes.append(f"safetensors inputs {blobs} generated instead of loaded")
    gen = generate_inputs(
        definition, workload, device=device, seed=SEED, problem_root=None, reference_module=module
    )
    notes.extend(gen.notes)
    return [gen.values[n] for n in definition.inputs]


def _build_inputs(
    definition: Definition,
    workload: Workload,
    env: dict[str, int],
    device: str,
    module: types.ModuleType,
    notes: list[str],
) -> list[Any]:
    """Real inputs on ``device``, or meta tensors of the declared shapes (scalars without
    a value get placeholders, noted)."""
    import torch

    if device != "meta":
        return _generated_inputs(definition, workload, device, module, notes)
    scalars = workload.scalar_inputs()
    args: list[Any] = []
    for name, spec in definition.inputs.items():
        shape = resolve_shape(spec.shape, env)
        if shape is None:
            if name in scalars:
                args.append(scalars[name])
            else:
                args.append(_placeholder_scalar(spec))
                notes.append(f"scalar {name} has no value here: placeholder {args[-1]!r} used")
            continue
        args.append(torch.empty(shape, dtype=torch_dtype_of(spec.dtype), device="meta"))
    return args


def _run_counted(
    definition: Definition,
    workload: Workload,
    env: dict[str, int],
    device: str,
    placeholders: bool,
    notes: list[str],
) -> tuple[dict[str, float], list[OpCount]]:
    import torch

    mode = _counter_mode(placeholders)
    # Input generation and references may seed or draw from torch's global RNG: the
    # caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[] if device != "cuda" else None):
        module = _reference_module(definition)
        args = _build_inputs(definition, workload, env, device, module, notes)
        with _device_redirect(device), mode:
            module.run(*args)
    if mode.placeholder_reads:
        notes.append(
            f"{mode.placeholder_reads} data-dependent scalar read(s) on meta tensors "
            "returned placeholders (1 / 1.0 / True): control flow that depends on "
            "values may differ from a real run"
        )
    by_class: dict[str, float] = {}
    ops: list[OpCount] = []
    for (op, cls), (calls, flops) in sorted(mode.counts.items()):
        by_class[cls] = by_class.get(cls, 0.0) + flops
        ops.append(OpCount(op=op, dtype_class=cls, calls=int(calls), flops=flops))
    return by_class, ops


def _counted(
    definition: Definition, workload: Workload, env: dict[str, int], device: str, ph: bool
) -> tuple[dict[str, float], list[OpCount], list[str]]:
    notes: list[str] = []
    by_class, ops = _run_counted(definition, workload, env, device, ph, notes)
    return by_class, ops, notes


def run_counted_in_child(
    definition: Definition,
    workload: Workload,
    env: dict[str, int],
    device: str,
    placeholders: bool = False,
) -> tuple[dict[str, float], list[OpCount], list[str]]:
    """A count on real ``device`` tensors in a new (spawned) process: its memory goes back
    to the driver when the child exits (a count in the calling process can keep GiBs held
    after ``gc.collect`` and ``empty_cache``, which the guard's workers then lack). A
    failure in the child is raised here (a crash of the child as ``BrokenProcessPool``)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_counted, definition, workload, env, device, placeholders).result()


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    first = first if len(first) <= 160 else first[:157] + "..."
    return f"{type(e).__name__}: {first}".rstrip(": ")


def count_workload(
    definition: Definition,
    workload: Workload,
    *,
    device: Literal["meta", "cpu", "cuda"] = "meta",
    cpu_limit_bytes: int = CPU_LIMIT_BYTES,
    gpu_fallback: bool = False,
) -> WorkloadCost:
    """Flops per dtype class and bytes of one workload (see the module docstring).

    ``device="meta"`` (default) counts on meta tensors with the fallbacks described above
    (``gpu_fallback``: real GPU tensors before the placeholders); ``"cpu"`` or ``"cuda"``
    run the reference on real tensors of that device directly.
    """
    env = resolve_axes(definition, workload)
    sizes, in_bytes, out_bytes = tensor_bytes(definition, env)
    notes: list[str] = []
    errors: list[str] = []
    attempts: list[tuple[Method, str, bool]]
    if device == "meta":
        attempts = [("meta", "meta", False)]
        packed_fp4 = any(s.dtype == DType.float4_e2m1fn_x2 for s in definition.inputs.values())
        if in_bytes <= cpu_limit_bytes and not packed_fp4:
            attempts.append(("cpu", "cpu", False))
        if gpu_fallback:
            attempts.append(("cuda", "cuda", False))
        attempts.append(("meta-placeholders", "meta", True))
    elif device in ("cpu", "cuda"):
        attempts = [(device, device, False)]
    else:
        raise ValueError(f"device must be 'meta', 'cpu' or 'cuda', not {device!r}")

    def cost(**kw: Any) -> WorkloadCost:
        return WorkloadCost(
            definition=definition.name,
            workload=workload.uuid,
            axes=env,
            bytes=in_bytes + out_bytes,
            input_bytes=in_bytes,
            output_bytes=out_bytes,
            bytes_by_tensor=sizes,
            **kw,
        )

    for method, dev, placeholders in attempts:
        attempt_notes: list[str] = []
        try:
            if dev == "cuda":
                by_class, ops, attempt_notes = run_counted_in_child(
                    definition, workload, env, dev, placeholders
                )
            else:
                by_class, ops = _run_counted(
                    definition, workload, env, dev, placeholders, attempt_notes
                )
        except Exception as e:  # any failure of the reference: recorded, next attempt
            errors.append(f"{method}: {_describe(e)}")
            continue
        if errors:
            notes.append("earlier attempts failed: " + "; ".join(errors))
        return cost(flops_by_class=by_class, ops=ops, method=method, notes=notes + attempt_notes)
    if device == "meta" and in_bytes > cpu_limit_bytes:
        errors.append(
            f"cpu: not tried, inputs are {in_bytes / 2**20:.0f} MiB "
            f"> {cpu_limit_bytes / 2**20:.0f} MiB"
        )
    elif device == "meta" and packed_fp4:
        errors.append("cpu: not tried, torch has no CPU kernels for packed FP4 matmuls")
    hint = (
        ""
        if any(dev == "cuda" for _, dev, _ in attempts)
        else "; count it on real GPU tensors instead "
        "(count_workload(..., device='cuda'), or kernelarc sol --count-on cuda)"
    )
    reason = (
        f"{definition.name} workload {workload.uuid}: the reference could not be "
        f"counted ({'; '.join(errors)}){hint}"
    )
    return cost(flops_by_class=None, method="none", reason=reason, notes=notes)
