"""Emitting a rewritten fx graph as a standalone ``solution.py`` (plain Python source).

The body is the graph's own generated code (``Graph.python_code``); every global it needs
is re-created as an import (modules, importable classes and functions, verified to resolve
to the very same object), ``inf``/``nan`` as ``float(...)``, or a string literal. Anything
else (a tensor constant, a lambda, a local function) is a :class:`CodegenError`: nothing is
pickled and nothing refers to the problem's files. The entry ``run`` keeps the reference's
parameter names and its ``torch.no_grad()``/``torch.inference_mode()`` decorator.

Not covered: graphs with ``get_attr`` or ``call_module`` nodes (function traces of the
supported references have none; they are refused before this point).
"""

from __future__ import annotations

import copy
import importlib
import keyword
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.fx

FORWARD = "_kernelarc_rewritten"


class CodegenError(Exception):
    """The graph needs something that cannot be written as plain source."""


def _resolves(module: str, qualname: str, obj: Any) -> bool:
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        return False
    return target is obj


def _global_line(name: str, obj: Any) -> str:
    import types

    if not name.isidentifier() or keyword.iskeyword(name):
        raise CodegenError(f"global {name!r} is not an identifier")
    if isinstance(obj, types.ModuleType):
        mod = obj.__name__
        return f"import {mod}" if mod == name else f"import {mod} as {name}"
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return f"{name} = float({str(obj)!r})"
    if isinstance(obj, str):
        return f"{name} = {obj!r}"
    if obj is type(None):
        return f"{name} = type(None)"
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        for mod in (module, module.split(".")[0]):
            if _resolves(mod, qualname, obj):
                if "." not in qualname:
                    alias = "" if qualname == name else f" as {name}"
                    return f"from {mod} import {qualname}{alias}"
                head, rest = qualname.split(".", 1)
                return f"from {mod} import {head} as _ka_{head}\n{name} = _ka_{head}.{rest}"
    raise CodegenError(f"global {name!r} ({type(obj).__name__}) cannot be emitted as source")


def emit_source(
    gm: torch.fx.GraphModule,
    params: Sequence[str],
    decorators: Sequence[str],
    header: str,
) -> str:
    """The standalone module text; ``run(*params)`` computes the graph."""
    graph = copy.deepcopy(gm.graph)
    for n in graph.nodes:
        n.type = None  # drop annotations: they would need more globals
        if n.op in ("get_attr", "call_module"):
            raise CodegenError(f"graph node {n.name} is a {n.op}; only function graphs are emitted")
    code = graph.python_code(root_module="self")
    lines = [f'"""{header.strip()}"""', "", "import torch"]
    for name, obj in sorted(code.globals.items()):
        if name == "torch":
            continue
        lines.append(_global_line(name, obj))
    src = code.src.strip("\n")
    if not src.startswith("def forward(self"):
        raise CodegenError("unexpected generated code (no forward(self, ...) function)")
    lines += ["", "", src.replace("def forward(self", f"def {FORWARD}(self", 1), "", ""]
    lines += [f"@{d}" for d in decorators]
    args = ", ".join(params)
    lines += [f"def run({args}):", f"    return {FORWARD}(None{', ' if args else ''}{args})", ""]
    source = "\n".join(lines)
    compile(source, "solution.py", "exec")  # a syntax error here is a bug: fail loudly
    return source


__all__ = ["FORWARD", "CodegenError", "emit_source"]
