"""Reward-hack defences that live inside the candidate's worker process.

What this covers, and how:

- **Audit hook** (``sys.addaudithook``; a hook cannot be removed once added). While armed it
  blocks *and* records: opening or listing the problem's files (``definition.json``,
  ``workload.jsonl``, ``reference.py``, ``*.safetensors``, any path under the problem root or
  naming the problem), other processes' ``/proc/<pid>`` entries; sockets (connect, bind,
  sendto, name lookups); process creation (``os.system``, ``os.fork``, ``os.exec*``,
  ``os.posix_spawn``, ``subprocess`` except the compilers that Triton and C++ builds run);
  ``ctypes`` loading a shared object from outside the system, Python and build-cache
  directories (a binary written at run time); environment changes; adding audit hooks.
- **Identity snapshots** taken before the candidate is imported: timers and clocks
  (``time.*``, ``torch.cuda.Event`` and its methods, synchronisation), and the guard's own
  functions (identity and ``__code__``), checked after import and after every call.
- **Threads** still alive after a call that were not alive before it, except the daemon
  threads libraries keep for their own bookkeeping (:data:`LIBRARY_THREADS`: tqdm's monitor,
  which torch.compile's progress bar starts), told apart by the exact class and the code of
  its ``run`` as imported before the candidate, never by name; **child processes** left
  behind; ``sys.settrace``/``sys.setprofile`` installed.
- **Precision flags** (TF32, reduced-precision reductions, float32 matmul precision) changed
  by the candidate: reported, and rejected only under ``--strict-precision``.
- ``static_scan.py`` (run by the parent on the sources): embedded binaries (long base64 or
  bytes literals) and driver-API module loading (``cuModuleLoadData`` and friends).

What it does not cover: the candidate runs in the same interpreter as this code, so a
candidate that deliberately rewrites this module's state through ``gc`` or raw memory, or
creates native threads or processes through raw system calls, is not stopped here. The
verdict does not depend on this process alone: reference outputs and the comparison live in
another process (see ``worker.py``), and OS isolation (``isolation.py``) removes the network
and the view of other processes where the OS allows it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Executables that libraries legitimately run during a call (Triton's ptxas and launcher
#: build, C++ toolchains, ldconfig for libcuda lookup).
ALLOWED_EXECUTABLES = frozenset(
    {
        "ptxas",
        "nvcc",
        "nvlink",
        "fatbinary",
        "cicc",
        "cuobjdump",
        "nvdisasm",
        "gcc",
        "g++",
        "cc",
        "c++",
        "clang",
        "clang++",
        "ld",
        "ld.lld",
        "ldconfig",
        "ldconfig.real",
        "ninja",
        # read-only introspection that ctypes.util.find_library and toolchains run
        "file",
        "objdump",
        "uname",
        "which",
    }
)
#: ``openssl`` is allowed only to hash files (torch.compile checksums its headers with it).
_DIGESTS = frozenset({"sha1", "sha256", "sha384", "sha512", "md5", "dgst"})
#: ``nvidia-smi`` is allowed only for read-only queries: Inductor asks it for the GPU's
#: clocks and names (through ``triton.testing.nvidia_smi`` and torch's ``collect_env``) while
#: it compiles. Every argument must be one of these; anything else (``-lgc``, ``-pm``,
#: ``-rgc``, ``-ac``, ``--reset``...) changes the GPU's state and is refused.
_SMI_FLAGS = frozenset({"-L", "--list-gpus", "-q", "--query", "topo", "-m", "--matrix"})
_SMI_PREFIXES = ("--query-gpu=", "--format=", "--id=", "--display=")
PROBLEM_FILE_NAMES = frozenset(
    {"definition.json", "workload.jsonl", "reference.py", "metadata.json"}
)


def _smi_query(name: str, argv: list[str]) -> bool:
    """Whether ``argv`` is a read-only ``nvidia-smi`` query (see ``_SMI_FLAGS``)."""
    if name != "nvidia-smi" or not argv:
        return False
    args = argv[1:]
    for i, a in enumerate(args):
        after_id = i > 0 and args[i - 1] in ("-i", "-d") and a.replace(",", "").isalnum()
        flag = a in _SMI_FLAGS or a in ("-i", "-d") or a.startswith(_SMI_PREFIXES)
        if not (flag or after_id):
            return False
    return True


_PROC_PID = re.compile(r"^/proc/(\d+)(/|$)")
_NET_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.gethostbyname_ex",
        "socket.getnameinfo",
    }
)
_SPAWN_EVENTS = frozenset(
    {"os.system", "os.exec", "os.fork", "os.forkpty", "os.spawn", "os.posix_spawn", "pty.spawn"}
)
_LIST_EVENTS = frozenset({"os.listdir", "os.scandir", "glob.glob"})
#: Environment variables that libraries manage themselves at run time (torch.compile and
#: Triton set their cache locations lazily; on CUDA, Inductor points Triton at the CUDA
#: tools it bundles, e.g. ``TRITON_PTXAS_PATH``, seen on the H200 2026-12-01); changes to
#: these are not tampering. Pointing a tool path elsewhere gains a solution nothing it could
#: not do in-process already; the processes it starts are still checked.
LIBRARY_ENV_PREFIXES = (
    "_TORCHINDUCTOR_",
    "TRITON_PTXAS",
    "TRITON_CUOBJDUMP",
    "TRITON_NVDISASM",
    "TRITON_CUDACRT",
    "TRITON_CUDART",
    "TRITON_LIBDEVICE",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "TORCH_COMPILE_",
    "TRITON_CACHE",
    "TRITON_HOME",
    "PYTORCH_KERNEL_CACHE",
)


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str


@dataclass
class Policy:
    candidate_dir: Path
    forbidden_roots: tuple[Path, ...]
    problem_name: str
    library_roots: tuple[Path, ...]


def _timer_targets() -> list[tuple[str, Any, str]]:
    import time

    targets: list[tuple[str, Any, str]] = [
        ("time", time, n)
        for n in (
            "perf_counter",
            "perf_counter_ns",
            "monotonic",
            "monotonic_ns",
            "time",
            "time_ns",
            "process_time",
            "sleep",
        )
    ]
    import torch

    cuda = torch.cuda
    targets += [
        ("torch.cuda", cuda, n)
        for n in ("synchronize", "Event", "current_stream", "default_stream", "Stream")
    ]
    targets += [
        ("torch.cuda.Event", cuda.Event, n)
        for n in ("record", "elapsed_time", "synchronize", "query", "wait")
    ]
    targets += [("torch.cuda.Stream", cuda.Stream, n) for n in ("synchronize", "wait_stream")]
    targets += [("torch._C", torch._C, n) for n in ("_cuda_synchronize",) if hasattr(torch._C, n)]
    return targets


def _integrity_targets(modules: list[Any]) -> list[tuple[str, Any, str]]:
    import builtins
    import json

    import torch

    out: list[tuple[str, Any, str]] = []
    for mod in modules:
        for name, value in vars(mod).items():
            if callable(value) and getattr(value, "__module__", None) == mod.__name__:
                out.append((mod.__name__, mod, name))
    out += [("builtins", builtins, n) for n in ("open", "isinstance", "type", "getattr", "len")]
    out += [("json", json, n) for n in ("dumps", "loads")]
    out += [("os", os, n) for n in ("write", "read", "environ")]
    out += [
        ("torch", torch, n)
        for n in (
            "equal",
            "empty",
            "empty_like",
            "from_file",
            "isnan",
            "isinf",
            "abs",
            "allclose",
            "isclose",
            "where",
        )
    ]
    out += [("torch.testing", torch.testing, "assert_close")]
    out += [
        ("torch.Tensor", torch.Tensor, n)
        for n in (
            "clone",
            "copy_",
            "equal",
            "view",
            "contiguous",
            "cpu",
            "numpy",
            "data_ptr",
            "untyped_storage",
            "fill_",
            "zero_",
            "to",
            "float",
        )
    ]
    return out


def precision_flags() -> dict[str, Any]:
    """Every precision switch torch exposes, legacy and new API. Reading a legacy switch
    after the new API was used raises in torch; that state is recorded as such."""
    import torch

    m = torch.backends.cuda.matmul
    getters: dict[str, Any] = {
        "cuda.matmul.allow_tf32": lambda: bool(m.allow_tf32),
        "cudnn.allow_tf32": lambda: bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": lambda: bool(
            m.allow_bf16_reduced_precision_reduction
        ),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": lambda: bool(
            m.allow_fp16_reduced_precision_reduction
        ),
    }
    for name, obj in (
        ("fp32_precision", torch.backends),
        ("cuda.matmul.fp32_precision", m),
        ("cudnn.fp32_precision", torch.backends.cudnn),
        ("mkldnn.fp32_precision", getattr(torch.backends, "mkldnn", None)),
    ):
        if obj is not None and hasattr(obj, "fp32_precision"):
            getters[name] = lambda o=obj: str(o.fp32_precision)
    flags: dict[str, Any] = {}
    for name, get in getters.items():
        try:
            flags[name] = get()
        except RuntimeError as e:  # torch refuses legacy reads once the new API was used
            flags[name] = f"unreadable: {str(e)[:80]}"
    return flags


def child_pids() -> list[int]:
    """Live children of this process. An unreadable /proc raises (the check cannot run,
    so the candidate is rejected as check-error); a thread that ends while it is read is
    skipped."""
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        with (
            contextlib.suppress(FileNotFoundError, ProcessLookupError),
            open(f"/proc/self/task/{tid}/children") as f,
        ):
            pids += [int(p) for p in f.read().split()]
    return pids


#: Daemon threads a library starts for itself and keeps: (module, class). tqdm's monitor
#: (one per process, started by the first progress bar: torch.compile's async compile makes
#: one) only checks whether bars need refreshing.
LIBRARY_THREADS = (("tqdm._monitor", "TMonitor"),)


def _library_thread_classes() -> dict[type, Any]:
    """The importable :data:`LIBRARY_THREADS` classes and the code of their ``run``,
    captured before the candidate is imported (it cannot swap either unseen)."""
    import importlib

    found: dict[type, Any] = {}
    for mod_name, cls_name in LIBRARY_THREADS:
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError):
            continue  # the library is not installed: none of its threads can appear
        found[cls] = cls.run.__code__
    return found


@dataclass
class Sentinel:
    """The candidate worker's monitor. ``install`` once, ``arm`` before importing the
    candidate, ``check_after_call`` after every call; ``harness()`` marks the guard's own
    work on the main thread (input generation, writing outputs), which is not policed."""

    policy: Policy
    violations: list[Violation] = field(default_factory=list)
    _armed: bool = False
    _harness: bool = False
    _adopted: set[int] = field(default_factory=set)

    def install(self) -> None:
        import sysconfig

        paths = sysconfig.get_paths()
        roots = {sys.prefix, sys.base_prefix, paths["purelib"], paths["platlib"], paths["stdlib"]}
        self._python_roots = tuple(os.path.realpath(r) + os.sep for r in roots if r)
        self._main = threading.get_ident()
        self._pid = str(os.getpid())
        sys.addaudithook(self._hook)

    def arm(self, guard_modules: list[Any]) -> None:
        self._timers = [(o, n, getattr(o, n)) for _, o, n in _timer_targets()]
        targets = _integrity_targets(guard_modules)
        self._integrity = [
            (o, n, getattr(o, n), getattr(getattr(o, n), "__code__", None)) for _, o, n in targets
        ]
        self._env = dict(os.environ)
        self._precision = precision_flags()
        self._threads = set(sys._current_frames())
        self._library_threads = _library_thread_classes()
        self._armed = True
        self._state = self._fingerprint()

    def _fingerprint(self) -> tuple[Any, ...]:
        p = self.policy
        return (
            id(self.violations),
            str(p.candidate_dir),
            p.forbidden_roots,
            p.problem_name,
            p.library_roots,
            id(self._timers),
            len(self._timers),
            id(self._integrity),
            len(self._integrity),
        )

    def adopt(self, children: set[int]) -> None:
        """Under ``harness()`` only: the threads alive now and the ``children`` processes are
        the guard's helpers (Inductor's compile pool, ``compile_pool.py``), not the
        candidate's; ``adopt(set())`` ends the exception for processes."""
        if not self._harness:
            raise RuntimeError("Sentinel.adopt is the guard's, inside harness() only")
        self._threads |= set(sys._current_frames())
        self._adopted = set(children)

    @contextlib.contextmanager
    def harness(self) -> Iterator[None]:
        self._harness = True
        try:
            yield
        finally:
            self._harness = False

    # -------------------------------------------------------------- audit hook
    def _flag(self, check: str, detail: str) -> None:
        self.violations.append(Violation(check, detail))
        raise PermissionError(f"blocked by the KernelArc guard ({check}): {detail}")

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._armed or (self._harness and threading.get_ident() == self._main):
            return
        if event == "open":
            path = args[0]
            if isinstance(path, int):
                return
            self._check_path(os.fsdecode(path), listing=False)
        elif event in _LIST_EVENTS:
            if args and isinstance(args[0], str | bytes):
                self._check_path(os.fsdecode(args[0]), listing=True)
        elif event in _NET_EVENTS:
            self._flag("network", f"{event}{args[:2]!r}")
        elif event == "subprocess.Popen":
            argv = (
                [os.fsdecode(a) for a in (args[1] or [])]
                if isinstance(args[1], list | tuple)
                else []
            )
            exe = os.fsdecode(args[0]) if args[0] else (argv[0] if argv else "")
            name = os.path.basename(exe)
            digest = name == "openssl" and len(argv) > 1 and argv[1] in _DIGESTS
            if name not in ALLOWED_EXECUTABLES and not digest and not _smi_query(name, argv):
                self._flag("subprocess", f"subprocess {exe!r}")
        elif event in _SPAWN_EVENTS:
            exe = os.fsdecode(args[0]) if args and isinstance(args[0], str | bytes) else ""
            if event == "os.posix_spawn" and os.path.basename(exe) in ALLOWED_EXECUTABLES:
                return
            self._flag("subprocess", f"{event} {exe!r}")
        elif event == "ctypes.dlopen":
            self._check_dlopen(args[0])
        elif event in ("os.putenv", "os.unsetenv"):
            key = os.fsdecode(args[0])
            if not key.startswith(LIBRARY_ENV_PREFIXES):
                self._flag("env-tamper", f"{event}({key!r})")
        elif event == "sys.addaudithook":
            self._flag("guard-integrity", "the solution installed an audit hook")

    def _check_path(self, raw: str, *, listing: bool) -> None:
        path = os.path.abspath(raw)
        m = _PROC_PID.match(path)
        if m and m.group(1) != self._pid:
            self._flag("file-access", f"another process's {path}")
        base = os.path.basename(path)
        real = os.path.realpath(path)
        # Name-based rules do not apply inside the Python installation (torch ships its own
        # "reference.py"); the problem directory itself stays forbidden below.
        packaged = real.startswith(self._python_roots)
        if (
            not listing
            and not packaged
            and (base in PROBLEM_FILE_NAMES or base.endswith(".safetensors"))
        ):
            if not path.startswith(str(self.policy.candidate_dir)):
                self._flag("file-access", f"opened {path}")
        if self.policy.problem_name and self.policy.problem_name in path and not packaged:
            self._flag("file-access", f"path names the problem: {path}")
        for root in self.policy.forbidden_roots:
            if real == str(root) or real.startswith(str(root) + os.sep):
                self._flag("file-access", f"{'listed' if listing else 'opened'} {path}")

    def _check_dlopen(self, name: Any) -> None:
        if name is None:
            return
        text = os.fsdecode(name)
        if "/" not in text:
            return  # resolved through the system's library search path
        real = os.path.realpath(text)
        for root in self.policy.library_roots:
            if real.startswith(str(root) + os.sep):
                return
        self._flag("binary-load", f"ctypes loaded {real}, outside system and build dirs")

    # -------------------------------------------------------------- after a call
    def check_after_call(self) -> list[Violation]:
        """Run every post-call check; returns what fired (the audit hook's own findings
        are collected separately, see :meth:`take`)."""
        found: list[Violation] = []
        if not self._armed or self._harness or self._state != self._fingerprint():
            found.append(Violation("guard-integrity", "the guard's monitor was tampered with"))
            self._armed, self._harness = True, False
        for obj, name, orig in self._timers:
            if getattr(obj, name, None) is not orig:
                found.append(
                    Violation("timer-patch", f"{getattr(obj, '__name__', obj)}.{name} was replaced")
                )
        for obj, name, orig, code in self._integrity:
            now = getattr(obj, name, None)
            if now is not orig or (code is not None and getattr(now, "__code__", None) is not code):
                found.append(
                    Violation(
                        "guard-integrity", f"{getattr(obj, '__name__', obj)}.{name} was replaced"
                    )
                )
        if sys.gettrace() is not None or sys.getprofile() is not None:
            found.append(Violation("guard-integrity", "a trace or profile function is set"))
        new = set(sys._current_frames()) - self._threads
        if new:
            by_id = {t.ident: t for t in threading.enumerate()}
            new = {i for i in new if not self._library_thread(by_id.get(i))}
        if new:
            names = [by_id[i].name for i in new if i in by_id] or [str(new)]
            found.append(Violation("threads", f"threads left running: {names}"))
        kids = [k for k in child_pids() if k not in self._adopted]
        if kids:
            found.append(Violation("subprocess", f"child processes left running: {kids}"))
        env = dict(os.environ)
        if env != self._env:
            keys = sorted(
                k
                for k in set(env) | set(self._env)
                if env.get(k) != self._env.get(k) and not k.startswith(LIBRARY_ENV_PREFIXES)
            )
            if keys:
                found.append(Violation("env-tamper", f"environment changed: {keys}"))
        return found

    def _library_thread(self, t: threading.Thread | None) -> bool:
        if t is None:
            return False
        code = self._library_threads.get(type(t))
        return code is not None and t.daemon and getattr(type(t).run, "__code__", None) is code

    def precision_changes(self) -> dict[str, Any]:
        now = precision_flags()
        return {k: v for k, v in now.items() if self._precision.get(k) != v}

    def take(self) -> list[Violation]:
        out = list(self.violations)
        self.violations.clear()
        return out
