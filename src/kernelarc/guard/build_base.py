"""What every builder shares: the :class:`Builder` interface, :class:`BuildArtifact` and
:class:`BuildError`, staging of sources, cache-file helpers (atomic JSON writes, ``flock``)
and :func:`kill_process_tree` for build processes that run out of time.

The builders themselves live in ``build.py`` (Python, and the registry) and ``build_cpp.py``
(C++/CUDA extensions); both import this module, neither imports the other's half.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelarc.problem.schema import Solution

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
