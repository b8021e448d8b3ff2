"""Builder registry: turn a :class:`~kernelarc.problem.schema.Solution` into something loadable.

Two halves, run in different processes:

- Parent side (the guard): :func:`choose_builder` picks the first builder of the registry that
  accepts the solution's languages, and its ``build`` stages the sources and checks them.
  :class:`PythonBuilder` stages and byte-compiles (syntax errors are caught here, nothing is
  imported); :class:`~kernelarc.guard.build_cpp.CudaCppBuilder` compiles a C++/CUDA torch
  extension in a separate process and caches the result.
- Worker side (the isolated candidate process): :func:`load_entry` imports the built module
  from the :class:`BuildArtifact` and returns the entry function.

Also here, shared by builders: :func:`stage_sources`, cache-file helpers (atomic JSON
writes, ``flock``) and :func:`kill_process_tree` for build processes that run out of time.

Every failure is a :class:`BuildError` (short reason as the message, full compiler output or
traceback in ``.log``); the evaluator turns it into a COMPILE_ERROR trace.

Not covered here: running the entry, sandboxing, or deciding whether a solution is correct.
A Python solution's siblings are imported by their own names (``import helpers``) from the
staging directory, which goes first on ``sys.path``; relative imports inside the entry file
(``from . import x``) do not work, because the entry is loaded as a top-level module.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelarc.problem.schema import Language, Solution

#: Official harness limit for compiling a C++ solution, in seconds.
DEFAULT_BUILD_TIMEOUT = 120.0


@dataclass(frozen=True)
class BuildArtifact:
    """What a builder produced; everything :func:`load_entry` needs, all plain data."""

    builder: str
    """``"python"`` or ``"cuda_cpp"``."""
    root: Path
    """Directory holding the staged sources (and the built ``.so`` for C++)."""
    module_path: Path
    """The entry ``.py`` file, or the built extension ``.so``."""
    module_name: str
    """Unique per content hash, e.g. ``ka_sol_<hash12>``."""
    symbol: str
    """Entry function name."""
    content_hash: str
    log: str = ""
    cached: bool = False


class BuildError(Exception):
    """A solution does not build or load. ``str(e)`` is the reason, ``e.log`` the full output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def module_name_for(solution: Solution) -> str:
    """The import name of a solution's entry module: stable for identical contents."""
    return f"ka_sol_{solution.content_hash()[:12]}"


class Builder(ABC):
    """One way of building solutions. Subclasses say which solutions they take and why not."""

    name: str

    @abstractmethod
    def why_not(self, solution: Solution) -> str | None:
        """``None`` when this builder can build ``solution``, else a one-line reason."""

    def can_build(self, solution: Solution) -> bool:
        return self.why_not(solution) is None

    @abstractmethod
    def build(
        self, solution: Solution, *, work_dir: Path, cache_dir: Path, timeout: float
    ) -> BuildArtifact:
        """Stage and build ``solution``; raise :class:`BuildError` on any failure."""


# ------------------------------------------------------------------------------ staging


def stage_sources(solution: Solution, dest: Path) -> None:
    """Write the solution's sources under ``dest`` (creating it) and remove anything else.

    Each file is written to a temporary name and renamed into place, so a concurrent stage of
    the same solution never exposes a half-written file. Files left in ``dest`` that are not
    sources (a stale ``__pycache__``, something a previous run wrote) are deleted, so the
    staged tree is exactly the solution.
    """
    dest.mkdir(parents=True, exist_ok=True)
    wanted: set[Path] = set()
    for src in solution.sources:
        target = dest / src.path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(src.content)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        wanted.add(target)
        wanted.update(target.parents)
    for path in sorted(dest.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path in wanted or (path.name.startswith(".") and path.name.endswith(".tmp")):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


# ------------------------------------------------------------------------------ helpers
# Shared by the builders: cache files, locks and build processes.


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or ``None`` when absent, torn or not an object (callers rebuild)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def file_lock(lock_path: Path, wait_s: float) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path``; give up with BuildError after ``wait_s``."""
    with lock_path.open("a") as fh:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BuildError(
                        f"another process has held {lock_path} for over {wait_s:.0f} s "
                        "(building the same solution); try again when it finishes"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _parent_pids() -> dict[int, int]:
    """pid → parent pid of every process, from ``/proc`` (empty where there is none)."""
    parents: dict[int, int] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return parents
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def kill_process_tree(pid: int) -> None:
    """Kill the process group led by ``pid`` and every descendant of ``pid``.

    Descendants may sit in other groups (ninja starts each command in its own), so the tree
    is frozen first: every process found is stopped with SIGSTOP, and the search repeats
    until no new descendant appears; then all of them get SIGKILL.
    """
    frozen: set[int] = set()
    _signal_group(pid, signal.SIGSTOP)
    while True:
        parents = _parent_pids()
        tree, grew = {pid}, True
        while grew:
            more = {p for p, pp in parents.items() if pp in tree} - tree
            tree |= more
            grew = bool(more)
        new = tree - frozen - {pid}
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        frozen |= new
    for p in frozen:
        _signal(p, signal.SIGKILL)
    _signal_group(pid, signal.SIGKILL)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # already gone: nothing left to stop
        pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the whole group has exited
        pass


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
    from kernelarc.guard.build_cpp import CudaCppBuilder

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
    from importlib.machinery import ExtensionFileLoader

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
