"""Builder registry: turn a :class:`~kernelarc.problem.schema.Solution` into something loadable.

Two halves, run in different processes:

- Parent side (the guard): :func:`choose_builder` picks the first builder of the registry that
  accepts the solution's languages, and its ``build`` stages the sources and checks them.
  :class:`PythonBuilder` stages and byte-compiles (syntax errors are caught here, nothing is
  imported); :class:`~kernelarc.guard.build_cpp.CudaCppBuilder` compiles a C++/CUDA torch
  extension in a separate process and caches the result.
- Worker side (the isolated candidate process): :func:`load_entry` imports the built module
  from the :class:`BuildArtifact` and returns the entry function.

What builders share (the :class:`Builder` interface, :class:`BuildArtifact`,
:class:`BuildError`, staging, cache-file helpers) is in ``build_base.py``.

Every failure is a :class:`BuildError` (short reason as the message, full compiler output or
traceback in ``.log``); the evaluator turns it into a COMPILE_ERROR trace.

Not covered here: running the entry, sandboxing, or deciding whether a solution is correct.
A Python solution's siblings are imported by their own names (``import helpers``) from the
staging directory, which goes first on ``sys.path``; relative imports inside the entry file
(``from . import x``) do not work, because the entry is loaded as a top-level module.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib.machinery import ExtensionFileLoader
from pathlib import Path
from typing import Any

from kernelarc.guard.build_base import (
    BuildArtifact,
    Builder,
    BuildError,
    module_name_for,
    stage_sources,
)
from kernelarc.guard.build_cpp import CudaCppBuilder
from kernelarc.problem.schema import Language, Solution

# ------------------------------------------------------------------------------ python


#: The package a Python-group language needs, checked with ``importlib.util.find_spec``.
PYTHON_LANGUAGE_PACKAGES: dict[Language, str] = {
    Language.pytorch: "torch",
    Language.triton: "triton",
    Language.cute_dsl: "cutlass",
    Language.cutile: "cuda.tile",
    Language.cudnn_frontend: "cudnn",
}


def _package_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a dotted name whose parent package is missing
        return False


class PythonBuilder(Builder):
    """Python-group solutions: stage the files and byte-compile every ``.py`` (no import)."""

    name = "python"

    def why_not(self, solution: Solution) -> str | None:
        langs = solution.spec.languages
        other = [lang.value for lang in langs if lang not in PYTHON_LANGUAGE_PACKAGES]
        if other:
            return f"{self.name}: does not build {', '.join(other)}"
        missing = [
            f"{lang.value} needs the Python package {PYTHON_LANGUAGE_PACKAGES[lang]!r}"
            for lang in langs
            if not _package_available(PYTHON_LANGUAGE_PACKAGES[lang])
        ]
        if missing:
            return f"{self.name}: " + "; ".join(missing) + ", which is not installed"
        if not solution.spec.entry_file.endswith(".py"):
            return f"{self.name}: entry file {solution.spec.entry_file!r} is not a .py file"
        return None

    def build(
        self, solution: Solution, *, work_dir: Path, cache_dir: Path, timeout: float
    ) -> BuildArtifact:
        reason = self.why_not(solution)
        if reason is not None:
            raise BuildError(reason)
        digest = solution.content_hash()
        root = work_dir / digest
        stage_sources(solution, root)
        for src in solution.sources:
            if not src.path.endswith(".py"):
                continue
            path = root / src.path
            try:
                compile(src.content, str(path), "exec", dont_inherit=True)
            except SyntaxError as e:
                where = f"{src.path}:{e.lineno}" if e.lineno else src.path
                log = "".join(traceback.format_exception_only(type(e), e))
                raise BuildError(f"Python syntax error at {where}: {e.msg}", log) from e
            except ValueError as e:  # e.g. source contains a NUL byte
                raise BuildError(f"{src.path} cannot be compiled: {e}", str(e)) from e
        return BuildArtifact(
            builder=self.name,
            root=root,
            module_path=root / solution.spec.entry_file,
            module_name=module_name_for(solution),
            symbol=solution.spec.entry_symbol,
            content_hash=digest,
        )


# ------------------------------------------------------------------------------ registry


def builders() -> list[Builder]:
    """The built-in builders, in priority order (a fresh list each call)."""
    return [PythonBuilder(), CudaCppBuilder()]


def choose_builder(solution: Solution, registry: Sequence[Builder] | None = None) -> Builder:
    """The first builder of ``registry`` (default :func:`builders`) that accepts ``solution``."""
    candidates = list(builders() if registry is None else registry)
    reasons: list[str] = []
    for builder in candidates:
        reason = builder.why_not(solution)
        if reason is None:
            return builder
        reasons.append(reason)
    langs = ", ".join(lang.value for lang in solution.spec.languages)
    supported = ", ".join(lang.value for lang in Language)
    names = ", ".join(b.name for b in candidates) or "none"
    raise BuildError(
        f"no builder for solution {solution.name!r} (languages: {langs}); "
        f"builders tried: {names}; languages KernelArc supports: {supported}",
        "\n".join(reasons),
    )


# ------------------------------------------------------------------------------ worker side


def load_entry(artifact: BuildArtifact) -> Callable[..., Any]:
    """Import the artifact's module in this process and return its entry function.

    ``artifact.root`` goes first on ``sys.path`` so a multi-file Python solution imports its
    siblings. A ``.so`` is loaded with ``ExtensionFileLoader`` after ``import torch`` (the
    extension links against libtorch). Any failure is a :class:`BuildError` whose log holds
    the traceback.
    """
    root = str(artifact.root)
    if root not in sys.path:
        sys.path.insert(0, root)
    path = artifact.module_path
    if not path.is_file():
        raise BuildError(f"built module {path} does not exist (was the build directory removed?)")
    name = artifact.module_name
    try:
        if path.suffix == ".py":
            spec = importlib.util.spec_from_file_location(name, path)
        else:
            import torch  # noqa: F401  (loads libtorch, which the extension links against)

            spec = importlib.util.spec_from_file_location(
                name, path, loader=ExtensionFileLoader(name, str(path))
            )
        if spec is None or spec.loader is None:
            raise ImportError(f"no import spec for {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise BuildError(
            f"importing {path.name} failed: {type(e).__name__}: {e}", traceback.format_exc()
        ) from e
    fn = getattr(module, artifact.symbol, None)
    if fn is None:
        public = sorted(n for n in dir(module) if not n.startswith("_"))
        raise BuildError(
            f"entry point {artifact.symbol!r} is not defined in {path.name}; "
            f"it defines: {', '.join(public) or 'nothing public'}"
        )
    if not callable(fn):
        raise BuildError(
            f"entry point {artifact.symbol!r} in {path.name} is a {type(fn).__name__}, "
            "not a function"
        )
    return fn  # type: ignore[no-any-return]
