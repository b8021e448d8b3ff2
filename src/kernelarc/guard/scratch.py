"""The guard's scratch folders, and the sweep of those a killed guard left behind.

A guard removes its folders when it closes (``Guard.close``). A guard whose process is
killed (SIGKILL, the machine's OOM killer, a lost session) cannot, and its scratch
folder lives in ``/dev/shm`` when that is writable, so what it held stays in RAM until the
next reboot. Every folder made here carries an ``owner`` file: the process id, that
process's start time and its PID namespace. A new guard removes the folders whose owner
is gone (:func:`sweep_stale`).

Covered: folders made by this module, on Linux (``/proc`` gives start times and
namespaces). Not covered: folders of other users (not readable as ours), folders without
an ``owner`` file (made by an older KernelArc: left alone, since nothing says whose they
are), folders of a process in another PID namespace (its process ids mean nothing here,
so it is never judged gone), and systems without ``/proc`` (no sweep at all).

Not a boundary against candidates: the file system is not isolated from them
(``isolation.py``), so a candidate can already write or remove these folders, ``owner``
file included.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

OWNER_FILE = "owner"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def owner_line() -> str | None:
    """``PID START NAMESPACE`` of this process, or None without /proc."""
    pid = os.getpid()
    start, ns = _start_time(pid), _pid_namespace()
    if start is None or ns is None:
        return None
    return f"{pid} {start} {ns}"


def make_scratch(prefix: str, base: str | Path | None = None) -> Path:
    """A new private folder (``tempfile.mkdtemp``) with an ``owner`` file naming this process."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    line = owner_line()
    if line is not None:
        (path / OWNER_FILE).write_text(line + "\n")
    return path


def _owner_gone(folder: Path, here_ns: str) -> bool:
    try:
        pid_s, start, ns = (folder / OWNER_FILE).read_text().split()
        pid = int(pid_s)
    except (OSError, ValueError):
        return False  # no owner file, or not one of ours: whose it is is unknown
    if ns != here_ns:
        return False
    # The process is gone, or its id now belongs to a process started at another time.
    return _start_time(pid) != start


def sweep_stale(prefix: str, base: str | Path | None = None) -> list[Path]:
    """Remove the folders ``base/prefix*`` whose owner process is gone; returns them.

    ``base`` defaults to the system's temporary folder, as ``make_scratch``'s does.
    """
    here_ns = _pid_namespace()
    if here_ns is None:
        return []
    root = Path(base) if base is not None else Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []
    uid = os.getuid()
    for folder in candidates:
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != uid:
                continue
        except OSError:
            continue
        if _owner_gone(folder, here_ns):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
    return removed


__all__ = ["OWNER_FILE", "make_scratch", "owner_line", "sweep_stale"]
