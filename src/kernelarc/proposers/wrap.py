"""Wrapping an existing solution: a new Solution whose entry file loads the original one.

:func:`wrap_solution` copies every source of a *base* solution unchanged and adds one
generated entry file (a name no base source uses). That file loads the base's entry module
from its own directory under a unique module name (``<wrapper module>__base``; the guard
stages all sources in one directory, which is first on ``sys.path``, so the base's siblings
keep importing by their own names) and then runs a strategy-specific body that defines the
new entry function around the base's entry (``_ka_base``). The wrapped solution keeps the
base's languages, destination-passing style, dependencies and target hardware, so it is a
drop-in SOL-ExecBench solution of the same definition.

Constants every body can use: ``_ka_base`` (the base's entry), ``_KA_DPS`` (bool),
``_KA_N_OUTPUTS`` (number of outputs of the definition; for destination-passing bases the
last ``_KA_N_OUTPUTS`` arguments are the destinations) and ``_KA_OUTPUT_DTYPES`` (the
declared output dtype names, in definition order). Module-level statements in the body run
at import, after the base was imported (so a policy set there wins over the base's own).

Covered: Python-group bases (pytorch, triton, and other Python-built languages), with one or
several files, destination-passing or not. Not covered: C++-group bases (``cuda_cpp``,
``cutlass``, ``cudnn``, ``cublas``). Their entry is a ``.so`` built by
``guard/build_cpp.py`` from a compiled source file; a solution mixing a Python entry with
C++ sources is rejected by the schema (language groups cannot mix), and building the
extension from Python inside the candidate worker would need a compiler subprocess, which
the guard forbids. :func:`why_not_wrappable` says so, and :func:`wrap_solution` raises
:class:`WrapError`.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from kernelarc.problem.schema import Definition, Solution

#: The entry function name of every wrapper.
WRAPPER_SYMBOL = "kernelarc_entry"


class WrapError(ValueError):
    """A base solution that cannot be wrapped (the message says why)."""


def why_not_wrappable(solution: Solution) -> str | None:
    """None when :func:`wrap_solution` can wrap ``solution``, else a one-line reason."""
    if solution.spec.is_cpp:
        langs = ", ".join(lang.value for lang in solution.spec.languages)
        return (
            f"a C++-group solution ({langs}) is built into an extension from its compiled "
            "sources; a Python wrapper entry cannot be added to it"
        )
    if not solution.spec.entry_file.endswith(".py"):
        return f"its entry file {solution.spec.entry_file!r} is not a Python file"
    return None


def wrapper_file_name(base: Solution, stem: str) -> str:
    """``<stem>.py``, or ``<stem>_<k>.py`` when a base source already has that path."""
    taken = {s.path for s in base.sources}
    candidate, k = f"{stem}.py", 1
    while candidate in taken:
        candidate, k = f"{stem}_{k}.py", k + 1
    return candidate


def base_loader_source(base: Solution, wrapper_path: str) -> str:
    """Python source that loads the base's entry function as ``_ka_base``."""
    wrapper_dir = PurePosixPath(wrapper_path).parent
    base_file = PurePosixPath(base.spec.entry_file)
    # The wrapper sits at the staging root (a top-level module); the base path is relative
    # to the directory the wrapper is in.
    if wrapper_dir != PurePosixPath("."):
        raise WrapError(f"the wrapper file {wrapper_path!r} must sit at the staging root")
    return (
        "import importlib.util as _ka_util\n"
        "import os as _ka_os\n"
        "import sys as _ka_sys\n"
        "\n"
        f"_KA_BASE_FILE = {str(base_file)!r}\n"
        f"_KA_BASE_SYMBOL = {base.spec.entry_symbol!r}\n"
        "\n"
        "\n"
        "def _ka_load_base():\n"
        "    here = _ka_os.path.dirname(_ka_os.path.abspath(__file__))\n"
        "    path = _ka_os.path.join(here, *_KA_BASE_FILE.split('/'))\n"
        "    name = __name__ + '__base'\n"
        "    spec = _ka_util.spec_from_file_location(name, path)\n"
        "    if spec is None or spec.loader is None:\n"
        "        raise ImportError(f'no import spec for the wrapped entry file {path}')\n"
        "    module = _ka_util.module_from_spec(spec)\n"
        "    _ka_sys.modules[name] = module\n"
        "    try:\n"
        "        spec.loader.exec_module(module)\n"
        "    except BaseException:\n"
        "        _ka_sys.modules.pop(name, None)\n"
        "        raise\n"
        "    fn = getattr(module, _KA_BASE_SYMBOL, None)\n"
        "    if not callable(fn):\n"
        "        raise ImportError(\n"
        "            f'{_KA_BASE_SYMBOL!r} is not a function of {_KA_BASE_FILE}'\n"
        "        )\n"
        "    return fn\n"
        "\n"
        "\n"
        "_ka_base = _ka_load_base()\n"
    )


def wrap_solution(
    base: Solution,
    definition: Definition,
    *,
    agent: str,
    name: str,
    description: str,
    body: str,
    stem: str,
    docstring: str,
) -> Solution:
    """A solution of ``definition`` whose entry ``<stem>.py::kernelarc_entry`` is defined by
    ``body`` around ``base``'s entry. ``body`` must define :data:`WRAPPER_SYMBOL`."""
    reason = why_not_wrappable(base)
    if reason is not None:
        raise WrapError(f"cannot wrap solution {base.name!r}: {reason}")
    if base.definition != definition.name:
        raise WrapError(
            f"solution {base.name!r} solves {base.definition!r}, not {definition.name!r}"
        )
    if f"def {WRAPPER_SYMBOL}(" not in body:
        raise WrapError(f"a wrapper body must define {WRAPPER_SYMBOL}()")
    if '"""' in docstring or "\\" in docstring:
        raise WrapError("a wrapper docstring may not contain triple quotes or backslashes")
    path = wrapper_file_name(base, stem)
    dtypes = tuple(spec.dtype.value for spec in definition.outputs.values())
    source = (
        f'"""{docstring.strip()}"""\n\n'
        + base_loader_source(base, path)
        + "\n"
        + f"_KA_DPS = {bool(base.spec.destination_passing_style)!r}\n"
        + f"_KA_N_OUTPUTS = {len(definition.outputs)!r}\n"
        + f"_KA_OUTPUT_DTYPES = {dtypes!r}\n"
        + "\n\n"
        + body.strip()
        + "\n"
    )
    spec = base.spec.model_dump(mode="json")
    spec["entry_point"] = f"{path}::{WRAPPER_SYMBOL}"
    sources = [s.model_dump(mode="json") for s in base.sources]
    sources.append({"path": path, "content": source})
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition.name,
            "author": f"kernelarc:{agent}",
            "description": description,
            "spec": spec,
            "sources": sources,
        }
    )


def python_sources(solution: Solution) -> str:
    """All ``.py`` sources of ``solution`` joined (for scanning what it calls)."""
    return "\n".join(s.content for s in solution.sources if s.path.endswith(".py"))


__all__ = [
    "WRAPPER_SYMBOL",
    "WrapError",
    "base_loader_source",
    "python_sources",
    "why_not_wrappable",
    "wrap_solution",
    "wrapper_file_name",
]
