"""Shape-gated composition: one SOL-ExecBench solution that routes each call by shape.

At the end of a search every workload has a best passing candidate. :func:`compose` turns
those winners into ONE Python solution whose entry, ``dispatch.py::run``, reads the values
of the dispatch axes from the call's arguments (:func:`axis_locator`), looks the tuple up
in a table built from the winners, and calls the implementation that won there; a shape
not in the table goes to ``default`` (normally the best single candidate). The guard then
judges the composed solution like any other; whether it is kept (it must beat the best
single candidate) is the orchestrator's decision.

Layout of the composed solution: ``dispatch.py`` at the root, and each distinct
implementation's sources (deduplicated by content hash) under ``impl_<k>/`` with their
relative layout kept; ``impl_0`` is always ``default``. The dispatcher imports an
implementation on its first use: its entry file is loaded by path under a unique module
name, with its ``impl_<k>/`` folder first on ``sys.path`` only while it imports, so its
sibling imports (``import helpers``) find its own files. When every part returns its
outputs (and the dispatch key is read from the inputs), the composed solution returns them
too. Otherwise it is destination passing: destination-passing parts get the outputs, the
others are called with the inputs and their results are copied into the outputs
(``out.copy_(res)``, after checking shape and dtype), which costs one extra copy.

Module-name collisions are refused, not worked around: when two implementations have a
non-entry module (a top-level ``.py`` file or a top-level package folder) of the same name
but different contents, :func:`compose` raises :class:`CompositionError`, because Python
keeps one module per name in ``sys.modules`` and the second would silently use the first
one's code. Identical files under the same name are allowed and shared.

The dispatch axes are the var axes, or, when one of them cannot be read from the arguments
(it only enters expressions), every var or expression axis that can (:func:`axis_locator`).

Not covered: the C++ group and Python languages other than pytorch/triton (future work);
two workloads with the same dispatch key but different winners (e.g. they differ only in
a non-axis scalar input, or in var axes the shapes do not show) are refused here: the caller
picks one winner per key (the orchestrator takes the fastest over the key's workloads).
An implementation that imports a sibling module for the first time *inside* a
call (not at import time) fails with ModuleNotFoundError, because its folder is on
``sys.path`` only while its entry imports; the guard then rejects the composition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from kernelarc.maths import geomean
from kernelarc.problem.axes import AxisError, resolve_axes
from kernelarc.problem.schema import (
    BuildSpec,
    ConstAxis,
    Definition,
    Language,
    Solution,
    SourceFile,
    Workload,
)

#: Languages whose solutions can be parts of a composition.
COMPOSABLE_LANGUAGES = frozenset({Language.pytorch, Language.triton})
#: The dispatcher's file and entry function in a composed solution.
COMPOSE_MARGIN = 2.0
"""A composition is judged only when the per-workload winners, routed at no cost, would beat
the best single candidate by more than this many times ``min_gain``: dispatching costs a
little on every call, which decides between near-equal parts of microsecond kernels."""
DISPATCH_FILE = "dispatch.py"
DISPATCH_SYMBOL = "run"

Locator = tuple[str, int, int]
"""Where a var axis is read at call time: ``("input", i, d)`` is ``inputs[i].shape[d]``,
``("output", i, d)`` is ``outputs[i].shape[d]`` (the composed solution is destination
passing, so outputs are always passed), ``("scalar", i, -1)`` is the scalar ``inputs[i]``."""


class CompositionError(ValueError):
    """The winners cannot be composed into one dispatching solution; the message says why."""


# ------------------------------------------------------------------------------ axes


def axis_locator(definition: Definition) -> dict[str, Locator]:
    """The dispatch axes (definition order) and where each is read from a call's arguments.

    Normally the var axes. Where one is read: the first tensor input (definition order) with
    a dimension named exactly like the axis; then the outputs; then a scalar input of that
    name. When some var axis is none of these (it only enters expressions, e.g. ``batch_size``
    and ``seq_len`` in ``num_tokens = batch_size * seq_len``), the calls' shapes cannot tell
    its values apart, and the dispatch axes are instead every var or expression axis that
    can be read (``num_tokens``): workloads that differ only in what cannot be read share a
    dispatch key (see :func:`dispatch_key`). With none readable, the key is empty.
    """
    var = {a: _locate(definition, a) for a in definition.var_axes}
    if all(loc is not None for loc in var.values()):
        return {a: loc for a, loc in var.items() if loc is not None}
    found: dict[str, Locator] = {}
    for axis, spec in definition.axes.items():
        if isinstance(spec, ConstAxis):
            continue
        loc = _locate(definition, axis)
        if loc is not None:
            found[axis] = loc
    return found


def _locate(definition: Definition, axis: str) -> Locator | None:
    loc = _find_dim(definition.inputs, axis, "input") or _find_dim(
        definition.outputs, axis, "output"
    )
    spec = definition.inputs.get(axis)
    if loc is None and spec is not None and spec.is_scalar:
        loc = ("scalar", list(definition.inputs).index(axis), -1)
    return loc


def dispatch_key(definition: Definition, workload: Workload) -> tuple[int, ...]:
    """The values of the dispatch axes (:func:`axis_locator`) for ``workload``: two workloads
    with the same key are the same call to a shape-gated dispatcher."""
    return _workload_key(definition, workload, list(axis_locator(definition)))


def _find_dim(specs: Mapping[str, object], axis: str, kind: str) -> Locator | None:
    for pos, spec in enumerate(specs.values()):
        shape = getattr(spec, "shape", None)
        if shape and axis in shape:
            return (kind, pos, shape.index(axis))
    return None


def _locator_text(definition: Definition, loc: Locator) -> tuple[str, str]:
    """(Python expression over ``args``, human-readable source) for one locator."""
    kind, pos, dim = loc
    if kind == "scalar":
        return f"args[{pos}]", list(definition.inputs)[pos]
    if kind == "input":
        return f"args[{pos}].shape[{dim}]", f"{list(definition.inputs)[pos]}.shape[{dim}]"
    index = len(definition.inputs) + pos
    return f"args[{index}].shape[{dim}]", f"{list(definition.outputs)[pos]}.shape[{dim}]"


def _workload_key(definition: Definition, workload: Workload, axes: list[str]) -> tuple[int, ...]:
    try:
        env = resolve_axes(definition, workload)
    except AxisError as e:
        raise CompositionError(f"workload {workload.uuid}: {e}") from e
    return tuple(env[a] for a in axes)


def routes(
    definition: Definition,
    workloads: Sequence[Workload],
    latencies: Mapping[str, Mapping[str, float]],
) -> dict[str, str]:
    """Per workload uuid, the candidate (a key of ``latencies``: candidate → workload uuid →
    ms) a dispatcher should route it to: the workloads of one dispatch key all go to the
    candidate with the lowest geomean latency over them (ties: the first in ``latencies``);
    a key no candidate measured fully is left out."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for wl in workloads:
        groups.setdefault(dispatch_key(definition, wl), []).append(wl.uuid)
    out: dict[str, str] = {}
    for uuids in groups.values():
        timed = [c for c, lat in latencies.items() if all(lat.get(u) for u in uuids)]
        if timed:
            best = min(timed, key=lambda c: _geomean([latencies[c][u] for u in uuids]))
            out.update({u: best for u in uuids})
    return out


def predicted_gain(
    definition: Definition,
    workloads: Sequence[Workload],
    latencies: Mapping[str, Mapping[str, float]],
) -> float:
    """What a composition would gain over the best single candidate if dispatching cost
    nothing: the geomean over workloads of the best single's latency over the routed one's
    (1.0 when one candidate wins everywhere, or nothing was measured on every workload)."""
    uuids = [w.uuid for w in workloads]
    full = {c: lat for c, lat in latencies.items() if all(lat.get(u) for u in uuids)}
    if len(full) < 2:
        return 1.0
    single = min(full, key=lambda c: _geomean([full[c][u] for u in uuids]))
    routed = routes(definition, workloads, full)
    return _geomean([full[single][u] / full[routed[u]][u] for u in uuids])


def _geomean(values: Sequence[float]) -> float:
    """``maths.geomean`` of latencies or their ratios, which here are never empty and all
    positive (the callers keep only measured workloads): anything else is a bug, raised."""
    g = geomean(values)
    if g is None:
        raise ValueError(f"no geometric mean of {list(values)!r}: no positive values")
    return g


# ------------------------------------------------------------------------------ parts


def _check_part(definition: Definition, solution: Solution, role: str) -> None:
    bad = [lang.value for lang in solution.spec.languages if lang not in COMPOSABLE_LANGUAGES]
    if bad:
        raise CompositionError(
            f"{role} solution {solution.name!r} uses {', '.join(bad)}; only "
            f"{', '.join(sorted(x.value for x in COMPOSABLE_LANGUAGES))} solutions can be "
            "composed (C++ composition is future work): leave it out of the winners"
        )
    if solution.definition != definition.name:
        raise CompositionError(
            f"{role} solution {solution.name!r} is for definition {solution.definition!r}, "
            f"not {definition.name!r}"
        )
    if not solution.spec.entry_file.endswith(".py"):
        raise CompositionError(
            f"{role} solution {solution.name!r}: entry file {solution.spec.entry_file!r} "
            "is not a .py file"
        )


def _module_files(solution: Solution) -> dict[str, frozenset[tuple[str, str]]]:
    """Top-level import name → the (path, content) files under it, entry file excluded."""
    names: dict[str, set[tuple[str, str]]] = {}
    for src in solution.sources:
        if src.path == solution.spec.entry_file:
            continue
        parts = PurePosixPath(src.path).parts
        if len(parts) > 1:
            name = parts[0]
        elif src.path.endswith(".py"):
            name = src.path[: -len(".py")]
        else:
            continue  # a data file at the top level is not importable
        names.setdefault(name, set()).add((src.path, src.content))
    return {n: frozenset(files) for n, files in names.items()}


def _check_collisions(parts: Sequence[Solution]) -> None:
    seen: dict[str, tuple[int, frozenset[tuple[str, str]]]] = {}
    for k, sol in enumerate(parts):
        for name, files in sorted(_module_files(sol).items()):
            if name not in seen:
                seen[name] = (k, files)
                continue
            other, other_files = seen[name]
            if files != other_files:
                raise CompositionError(
                    f"solutions {parts[other].name!r} (impl_{other}) and {sol.name!r} "
                    f"(impl_{k}) both have a module named {name!r} with different contents; "
                    "Python would load only one of them, so they cannot be composed "
                    "(rename the module in one of them)"
                )


# ------------------------------------------------------------------------------ compose


def compose(
    definition: Definition,
    workloads: Sequence[Workload],
    winners: Mapping[str, Solution],
    *,
    default: Solution,
    name: str = "kernelarc_composed",
) -> Solution:
    """One dispatching solution from per-workload winners (workload uuid → Solution).

    ``default`` serves every shape not in the table (including workloads without a winner
    whose dispatch key matches no winner's). Raises :class:`CompositionError` for a part
    that is not pytorch/triton or is for another definition, a winner for a uuid not among
    ``workloads``, two workloads with the same dispatch key (:func:`dispatch_key`) but
    different winners (choose one per key first), or colliding module names.
    """
    _check_part(definition, default, "default")
    by_uuid = {w.uuid: w for w in workloads}
    for uuid, sol in winners.items():
        if uuid not in by_uuid:
            raise CompositionError(
                f"winner {sol.name!r} is given for workload {uuid!r}, which is not among the "
                f"{len(by_uuid)} workloads passed"
            )
        _check_part(definition, sol, f"workload {uuid}'s winning")
    locators = axis_locator(definition)
    axes = list(locators)

    parts: list[Solution] = [default]
    index_of = {default.content_hash(): 0}
    table: dict[tuple[int, ...], int] = {}
    won: dict[tuple[int, ...], list[str]] = {}
    for wl in workloads:  # workload order, so impl numbering is deterministic
        winner = winners.get(wl.uuid)
        if winner is None:
            continue
        k = index_of.setdefault(winner.content_hash(), len(parts))
        if k == len(parts):
            parts.append(winner)
        key = _workload_key(definition, wl, axes)
        if key in table and table[key] != k:
            first = won[key][0]
            raise CompositionError(
                f"workloads {first} and {wl.uuid} have the same dispatch axes "
                f"{dict(zip(axes, key, strict=True))} but different winners "
                f"({parts[table[key]].name!r} and {winner.name!r}); a shape-gated dispatcher "
                "cannot tell them apart: pick one winner for both"
            )
        table[key] = k
        won.setdefault(key, []).append(wl.uuid)
    _check_collisions(parts)

    # When every part returns its outputs and the key is read from inputs only, the composed
    # solution returns them too: a destination-passing dispatcher copies every output of
    # every call (on GPU kernels of a few hundred microseconds, no measurable difference).
    returning = not any(p.spec.destination_passing_style for p in parts) and all(
        loc[0] != "output" for loc in locators.values()
    )
    dispatch = _render(definition, axes, locators, parts, table, won, name, returning)
    sources = [SourceFile(path=DISPATCH_FILE, content=dispatch)]
    for k, sol in enumerate(parts):
        sources += [
            SourceFile(path=f"impl_{k}/{src.path}", content=src.content) for src in sol.sources
        ]
    hardware = [
        h for h in default.spec.target_hardware if all(h in p.spec.target_hardware for p in parts)
    ]
    spec = BuildSpec(
        languages=sorted({lang for p in parts for lang in p.spec.languages}, key=lambda x: x.value),
        target_hardware=hardware or ["LOCAL"],
        entry_point=f"{DISPATCH_FILE}::{DISPATCH_SYMBOL}",
        destination_passing_style=not returning,
        dependencies=sorted({d for p in parts for d in p.spec.dependencies}),
    )
    return Solution(
        name=name,
        definition=definition.name,
        author="kernelarc",
        description=_describe(definition, axes, parts, table),
        spec=spec,
        sources=sources,
    )


def _key_text(axes: list[str], key: tuple[int, ...]) -> str:
    return ", ".join(f"{a}={v}" for a, v in zip(axes, key, strict=True)) or "(no var axes)"


def _describe(
    definition: Definition,
    axes: list[str],
    parts: list[Solution],
    table: Mapping[tuple[int, ...], int],
) -> str:
    items = []
    for k, sol in enumerate(parts):
        keys = [_key_text(axes, key) for key, idx in table.items() if idx == k]
        serves = "; ".join(keys) if keys else "no listed shape"
        role = "default, and " if k == 0 else ""
        items.append(f"impl_{k} = {sol.name} ({role}{serves})")
    return (
        f"Shape-gated composition of {len(parts)} implementation(s) for {definition.name}, "
        f"dispatching on ({', '.join(axes) or 'nothing'}): " + "; ".join(items) + "."
    )


def _render(
    definition: Definition,
    axes: list[str],
    locators: Mapping[str, Locator],
    parts: list[Solution],
    table: Mapping[tuple[int, ...], int],
    won: Mapping[tuple[int, ...], list[str]],
    name: str,
    returning: bool,
) -> str:
    n_in, n_out = len(definition.inputs), len(definition.outputs)
    arg_names = [*definition.inputs] + ([] if returning else [*definition.outputs])
    texts = [_locator_text(definition, locators[a]) for a in axes]
    exprs = [expr for expr, _ in texts]
    key_expr = f"({exprs[0]},)" if len(exprs) == 1 else f"({', '.join(exprs)})"
    lines = [
        f'"""Composed solution {name!r} for {definition.name!r} (generated by KernelArc).',
        "",
        "Each call is routed by the dispatch axes' values, read from the argument shapes, to",
        "the implementation that won that shape; other shapes go to the default, impl_0.",
        '"""',
        "",
        f"# Arguments: {', '.join(arg_names)} ({n_in} input(s), "
        + ("the outputs are returned)." if returning else f"then {n_out} output(s))."),
        "# Dispatch key: ("
        + ", ".join(f"{a} = {src}" for a, (_, src) in zip(axes, texts, strict=True))
        + ")",
        "#",
        "# Implementations:",
    ]
    for k, sol in enumerate(parts):
        style = "destination passing" if sol.spec.destination_passing_style else "returns outputs"
        role = "  [default]" if k == 0 else ""
        lines.append(f"#   impl_{k}: {sol.name} ({sol.spec.entry_point}, {style}){role}")
    lines += ["#", "# Table (shape -> implementation: workloads it won):"]
    for key, k in table.items():
        lines.append(f"#   {_key_text(axes, key)} -> impl_{k}: {', '.join(won[key])}")
    if not table:
        lines.append("#   (empty: every shape goes to impl_0)")
    lines += [
        "",
        "import importlib.util",
        "import sys",
        "from pathlib import Path",
        "",
        "_HERE = Path(__file__).resolve().parent",
        f"_N_INPUTS = {n_in}",
        f"_N_ARGS = {n_in if returning else n_in + n_out}",
        "# implementation -> (folder, entry file, entry function, destination passing)",
        "_IMPLS = (",
    ]
    for k, sol in enumerate(parts):
        spec = sol.spec
        lines.append(
            f"    ({f'impl_{k}'!r}, {spec.entry_file!r}, {spec.entry_symbol!r}, "
            f"{spec.destination_passing_style!r}),"
        )
    lines += [")", "# dispatch key -> implementation", "_TABLE = {"]
    lines += [f"    {key!r}: {k},  # {', '.join(won[key])}" for key, k in table.items()]
    lines += [
        "}",
        "_DEFAULT = 0",
        "# The lazy module cache: implementation -> its entry module.",
        "_LOADED = {}",
        "",
        "",
    ]
    body = _DISPATCH_BODY + (_RUN_RETURNING if returning else _RUN_DPS)
    lines += body.format(key_expr=key_expr, args=", ".join(arg_names)).splitlines()
    return "\n".join(lines) + "\n"


_DISPATCH_BODY = '''\
def _load(k):
    """Import implementation k's entry module (once), its folder first on sys.path."""
    folder, entry, symbol, _ = _IMPLS[k]
    root = str(_HERE / folder)
    path = _HERE / folder / entry
    module_name = f"{{__name__}}__impl_{{k}}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"composed solution: no import spec for {{path}}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, root)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise ImportError(f"composed solution: importing {{folder}}/{{entry}} failed: {{e}}") from e
    finally:
        if root in sys.path:
            sys.path.remove(root)
    if not callable(getattr(module, symbol, None)):
        sys.modules.pop(module_name, None)
        raise ImportError(f"composed solution: {{folder}}/{{entry}} has no function {{symbol!r}}")
    _LOADED[k] = module
    return module


def _pick(args):
    """The implementation serving this call's shape, and its entry function."""
    if len(args) != _N_ARGS:
        raise TypeError(f"composed solution: run takes {{_N_ARGS}} arguments, got {{len(args)}}")
    k = _TABLE.get({key_expr}, _DEFAULT)
    module = _LOADED.get(k)
    if module is None:
        module = _load(k)
    return k, getattr(module, _IMPLS[k][2])

'''

_RUN_DPS = '''

def _store(k, result, outputs):
    """Copy a returning implementation's result into the destination outputs."""
    if len(outputs) == 1 and not isinstance(result, (tuple, list)):
        result = (result,)
    if not isinstance(result, (tuple, list)) or len(result) != len(outputs):
        raise TypeError(
            f"composed solution: impl_{{k}} returned {{type(result).__name__}}, "
            f"expected {{len(outputs)}} output tensor(s)"
        )
    for i, (out, res) in enumerate(zip(outputs, result)):
        if res.shape != out.shape or res.dtype != out.dtype:
            raise ValueError(
                f"composed solution: impl_{{k}} output {{i}} is "
                f"{{tuple(res.shape)}} {{res.dtype}}, expected {{tuple(out.shape)}} {{out.dtype}}"
            )
        out.copy_(res)


def run(*args):
    """Arguments: {args}."""
    k, fn = _pick(args)
    if _IMPLS[k][3]:
        fn(*args)
    else:
        _store(k, fn(*args[:_N_INPUTS]), args[_N_INPUTS:])
'''

_RUN_RETURNING = '''

def run(*args):
    """Arguments: {args}; returns the outputs of the implementation that serves the shape."""
    return _pick(args)[1](*args)
'''
