"""Tracing a reference's ``run`` with ``torch.fx`` and propagating facts over workloads.

- :func:`trace_reference` loads the reference module and symbolically traces ``run``
  (``torch.fx.symbolic_trace``: inputs are proxies, ``.shape`` reads become graph nodes).
  It raises :class:`UntraceableError` with a readable reason when fx cannot trace it
  (Python control flow on tensor values or shapes, loops over proxies, item assignment,
  unknown decorators) or when the graph holds frozen tensor constants (``get_attr``), which
  could only be emitted as pickles.
- :func:`propagate` runs the graph on *meta* tensors (no memory, no compute) for the shapes
  of several workloads and records, per node and workload, the tensor's shape, dtype and
  contiguity, or the Python value of a non-tensor node. Rewrites only fire when the facts
  they need hold on every propagated workload.

- With the workloads given, tracing *evaluates* what Python needs concretely (``assert
  n == 2048``, ``if x.dim() == 3``, ``b, s, h = x.shape``): the partial graph is run on meta
  inputs of every propagated workload, and the trace goes on when the value is the same
  Python value on all of them (a branch is specialised to the side every workload takes;
  an assert that holds everywhere is dropped; a shape unpacks into its items). A value
  that differs between workloads, depends on a scalar input whose value is not known for
  every workload (its stand-in is not the real value) or on tensor data (meta tensors have
  none) stays untraceable.

``len``, ``int`` and ``range`` of a proxy are answered the same way (a loop over a
constant count unrolls). Scalar inputs take the workloads' own values when the caller
passes them (the agent gets them from its context: ``AgentContext.scalars``), else neutral
stand-ins. Not covered: loops or sizes that differ between workloads; scalars produced by a
custom input generator (not in the workload file: stand-ins), so a reference whose
*shapes* depend on such a scalar may fail to propagate, which is reported as untraceable.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.expressions import AxisError
from kernelarc.problem.inputs import load_reference_module, torch_dtype
from kernelarc.problem.schema import Definition, Workload

if TYPE_CHECKING:
    import torch
    import torch.fx

#: Decorators of ``run`` that are re-applied to the emitted ``run`` (anything else: refused).
KNOWN_DECORATORS = ("torch.no_grad()", "torch.inference_mode()")
#: At most this many distinct workload shapes are propagated.
MAX_PROPAGATED = 8
_SCALAR_STANDIN: dict[str, Any] = {"bool": False}


class UntraceableError(Exception):
    """The reference cannot be traced (or its graph cannot be analysed); ``str`` says why."""


@dataclass(frozen=True)
class TensorFact:
    shape: tuple[int, ...]
    dtype: torch.dtype
    contiguous: bool


@dataclass
class Facts:
    """Per node, one recorded value per propagated workload (a TensorFact or a Python value)."""

    runs: int
    values: dict[torch.fx.Node, list[Any]] = field(default_factory=dict)

    def tensors(self, node: Any) -> list[TensorFact] | None:
        """The node's tensor facts on every run, or None when it is not always a tensor."""
        vals = self.values.get(node) if _is_node(node) else None
        if vals is None or len(vals) != self.runs:
            return None
        if not all(isinstance(v, TensorFact) for v in vals):
            return None
        return list(vals)

    def dtype(self, node: Any) -> torch.dtype | None:
        """The node's dtype when it is a tensor of one dtype on every run."""
        ts = self.tensors(node)
        if not ts or len({t.dtype for t in ts}) != 1:
            return None
        return ts[0].dtype

    def ndim(self, node: Any) -> int | None:
        ts = self.tensors(node)
        if not ts or len({len(t.shape) for t in ts}) != 1:
            return None
        return len(ts[0].shape)

    def constant(self, node: Any) -> Any:
        """The node's Python value when it is the same non-tensor on every run (a literal
        argument is its own constant); raises KeyError otherwise."""
        if not _is_node(node):
            return node
        vals = self.values.get(node)
        if vals is None or len(vals) != self.runs or any(isinstance(v, TensorFact) for v in vals):
            raise KeyError(node)
        first = vals[0]
        if any(type(v) is not type(first) or v != first for v in vals[1:]):
            raise KeyError(node)
        return first

    def is_scalar(self, node: Any) -> bool:
        """A Python number (a literal or a node that is a float/int on every run)."""
        if not _is_node(node):
            return isinstance(node, int | float) and not isinstance(node, bool)
        vals = self.values.get(node)
        return (
            vals is not None
            and len(vals) == self.runs
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals)
        )


def _is_node(x: Any) -> bool:
    import torch.fx

    return isinstance(x, torch.fx.Node)


def run_decorators(source: str) -> list[str]:
    """The decorator expressions of the top-level ``run`` (as source text)."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "run":
            return [ast.unparse(d) for d in node.decorator_list]
    raise UntraceableError("the reference has no top-level function run")


def trace_reference(
    definition: Definition,
    workloads: Sequence[dict[str, int]] | None = None,
    scalars: Sequence[dict[str, Any]] | None = None,
) -> torch.fx.GraphModule:
    """``run`` of the reference as an fx GraphModule (see the module docstring); with
    ``workloads`` (and their scalar inputs' values), Python control flow on shapes (and on
    the known scalars) is evaluated on them."""
    import torch.fx

    unknown = [d for d in run_decorators(definition.reference) if d not in KNOWN_DECORATORS]
    if unknown:
        raise UntraceableError(f"run has decorators fx tracing would drop: {', '.join(unknown)}")
    module = load_reference_module(definition, name="kernelarc_rewrite_reference")
    run = getattr(module, "run", None)
    if not callable(run):
        raise UntraceableError("the reference defines no callable run")
    try:
        if workloads is None:
            gm = torch.fx.symbolic_trace(run)
        else:
            probes = pick_workloads(workloads, scalars) or [({}, {})]
            tracer = _evaluating_tracer_class()(definition, probes)
            graph = tracer.trace(run)
            gm = torch.fx.GraphModule(tracer.root, graph, "run")
    except Exception as e:  # fx raises TraceError, TypeError, ... depending on the construct
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UntraceableError(f"torch.fx cannot trace run ({type(e).__name__}: {first})") from e
    consts = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    if consts:
        raise UntraceableError(
            f"run creates {len(consts)} tensor constant(s) from literals; fx freezes them "
            "into the graph and they cannot be emitted without pickles"
        )
    placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    if placeholders != list(definition.inputs):
        raise UntraceableError(
            f"run's parameters {placeholders} differ from the definition's inputs "
            f"{list(definition.inputs)}"
        )
    return gm


@functools.cache
def _evaluating_tracer_class() -> type:
    """The tracer class, built once on first use (torch is imported only here)."""
    import torch
    import torch.fx

    class EvaluatingTracer(torch.fx.Tracer):
        """fx tracing that answers ``bool``, ``iter``, ``len`` and ``int`` of a proxy with
        the value the partial graph has on every workload, when it is the same on all."""

        def __init__(self, definition: Definition, probes: list[Probe]) -> None:
            super().__init__()
            self.definition, self.probes = definition, probes
            scalars = {n for n, spec in definition.inputs.items() if spec.shape is None}
            # scalar inputs whose real value is not known for every probe: stand-ins only
            self.unknown = {n for n in scalars if any(n not in sc for _, sc in probes)}

        def _value(self, node: torch.fx.Node, what: str) -> Any:
            seen, stack = set(), [node]
            while stack:
                n = stack.pop()
                if n in seen:
                    continue
                seen.add(n)
                if n.op == "placeholder" and n.target in self.unknown:
                    raise torch.fx.proxy.TraceError(
                        f"{what} depends on the scalar input {n.target!r}"
                    )
                stack.extend(n.all_input_nodes)
            partial = torch.fx.Graph()
            env: dict[torch.fx.Node, torch.fx.Node] = {}
            for n in self.graph.nodes:
                env[n] = partial.node_copy(n, lambda x: env[x])
                if n is node:
                    break
            partial.output(env[node])
            gm = torch.fx.GraphModule(self.root, partial)
            values = []
            for axes, known in self.probes:
                try:
                    with torch.no_grad():  # an Interpreter: calling gm would be traced
                        run = torch.fx.Interpreter(gm).run
                        values.append(run(*meta_inputs(self.definition, axes, known)))
                except Exception as e:
                    raise torch.fx.proxy.TraceError(
                        f"{what} cannot be evaluated on meta inputs ({type(e).__name__})"
                    ) from e
            if any(isinstance(v, torch.Tensor) for v in values):
                raise torch.fx.proxy.TraceError(f"{what} depends on tensor values")
            return values

        @staticmethod
        def _same(values: list[Any], what: str) -> Any:
            if any(v != values[0] for v in values[1:]):
                raise torch.fx.proxy.TraceError(f"{what} differs between workloads")
            return values[0]

        def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
            return proxy_class(node, self)

        def length(self, obj: torch.fx.Proxy) -> int:
            values = self._value(obj.node, "a length")
            return int(self._same([len(v) for v in values], "a length"))

        def integer(self, obj: torch.fx.Proxy) -> int:
            values = self._value(obj.node, "an integer")
            if not all(isinstance(v, int) for v in values):
                raise torch.fx.proxy.TraceError("only integers convert to int")
            return int(self._same(values, "an integer (a loop count or a size)"))

        def to_bool(self, obj: torch.fx.Proxy) -> bool:
            values = [bool(v) for v in self._value(obj.node, "a condition")]
            return bool(self._same(values, "a condition"))

        def iter(self, obj: torch.fx.Proxy) -> Any:
            values = self._value(obj.node, "an unpacked value")
            if not all(isinstance(v, tuple | list) for v in values):
                raise torch.fx.proxy.TraceError("only shapes and tuples are unpacked")
            n = self._same([len(v) for v in values], "the length of an unpacked value")
            proxy: Any = obj
            return iter([proxy[i] for i in range(n)])

    class Evaluating:
        """``len(p)``, ``int(p)`` and ``range(p)`` answered by the tracer (see above)."""

        tracer: Any

        def __len__(self) -> int:
            return int(self.tracer.length(self))

        def __int__(self) -> int:
            return int(self.tracer.integer(self))

        def __index__(self) -> int:
            return int(self.tracer.integer(self))

        def __getattr__(self, k: str) -> Any:  # x.shape, x.T.shape: proxies of this kind too
            me: Any = self
            return EvaluatingAttribute(me, k)

    class EvaluatingAttribute(Evaluating, torch.fx.proxy.Attribute):
        pass

    class EvaluatingProxy(Evaluating, torch.fx.Proxy):
        pass

    proxy_class = EvaluatingProxy
    return EvaluatingTracer


#: One propagated workload: its axes and the values of its scalar inputs (those known).
Probe = tuple[dict[str, int], dict[str, Any]]


def pick_workloads(
    workloads: Sequence[dict[str, int]], scalars: Sequence[dict[str, Any]] | None = None
) -> list[Probe]:
    """Distinct (axes, scalar values) pairs, at most :data:`MAX_PROPAGATED`, spread from
    smallest to largest. ``scalars``: per workload (same order), its scalar inputs' values."""
    given = list(scalars) if scalars else [{} for _ in workloads]
    if len(given) != len(workloads):
        raise ValueError(f"{len(given)} scalar sets for {len(workloads)} workloads")
    distinct: list[Probe] = []
    for w, sc in zip(workloads, given, strict=True):
        if (w, sc) not in distinct:
            distinct.append((dict(w), dict(sc)))
    distinct.sort(key=lambda p: (math.prod(max(v, 1) for v in p[0].values()), sorted(p[0].items())))
    if len(distinct) <= MAX_PROPAGATED:
        return distinct
    step = (len(distinct) - 1) / (MAX_PROPAGATED - 1)
    return [distinct[round(i * step)] for i in range(MAX_PROPAGATED)]


def meta_inputs(
    definition: Definition, axes: dict[str, int], scalars: dict[str, Any] | None = None
) -> list[Any]:
    """Meta tensors for one workload's axes, in input order; scalar inputs take their value
    from ``scalars`` where given, else a neutral stand-in."""
    import torch

    try:
        env = resolve_axes(definition, Workload(uuid="rewrite-probe", axes=axes))
    except AxisError as e:
        raise UntraceableError(f"axes {axes} do not resolve: {e}") from e
    values: list[Any] = []
    for name, spec in definition.inputs.items():
        shape = resolve_shape(spec.shape, env)
        kind = spec.dtype.value
        if shape is None:
            if scalars and name in scalars:
                values.append(scalars[name])
            elif kind == "bool":
                values.append(_SCALAR_STANDIN["bool"])
            elif kind.startswith(("int", "uint")):
                values.append(1)
            else:
                values.append(1e-6)
            continue
        try:
            values.append(torch.empty(shape, dtype=torch_dtype(spec.dtype), device="meta"))
        except Exception as e:
            raise UntraceableError(f"input {name!r}: no meta tensor for {kind}: {e}") from e
    return values


def propagate(
    gm: torch.fx.GraphModule,
    definition: Definition,
    workloads: Sequence[dict[str, int]],
    scalars: Sequence[dict[str, Any]] | None = None,
) -> Facts:
    """Facts of every node of ``gm`` on meta inputs of each workload (see module docstring)."""
    import torch
    import torch.fx

    chosen = pick_workloads(workloads, scalars) or [({}, {})]
    facts = Facts(runs=len(chosen))

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            facts.values.setdefault(n, []).append(_fact(result))
            return result

    for axes, known in chosen:
        args = meta_inputs(definition, axes, known)
        try:
            with torch.no_grad():
                _Recorder(gm).run(*args)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise UntraceableError(
                f"the traced graph does not run on meta tensors for axes {axes} "
                f"({type(e).__name__}: {first[:160]})"
            ) from e
    return facts


def _fact(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return TensorFact(tuple(value.shape), value.dtype, bool(value.is_contiguous()))
    if isinstance(value, torch.Size):
        return tuple(int(v) for v in value)
    if isinstance(value, tuple | list):
        return type(value)(_fact(v) for v in value)
    return value


__all__ = [
    "Facts",
    "TensorFact",
    "UntraceableError",
    "meta_inputs",
    "pick_workloads",
    "propagate",
    "run_decorators",
    "trace_reference",
]
