"""Starting, talking to and killing worker processes; what the OS can isolate.

Each worker is a fresh ``python -m kernelarc.guard.worker`` in its own process group, with:

- a scrubbed environment: every parent variable whose name looks like a secret (``*KEY*``,
  ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ...) or belongs to an LLM provider or cloud
  (``OPENAI_*``, ``ANTHROPIC_*``, ``HF_*``, ``AWS_*``, ...) is dropped (``env.is_secret``);
- where the OS allows it, new network, PID and mount namespaces (``unshare``): no network
  interfaces but loopback-down, and a ``/proc`` that shows only the worker's own processes,
  so the parent's environment and memory are not readable through ``/proc``. Tried in
  order: as root; through a user namespace; network only; none. The chosen level is
  reported in every trace's log;
- its own stdout/stderr log file, and a hard deadline on every request: on expiry the whole
  process group is killed (SIGKILL).

The reference worker (the problem's own code) gets the same, except while large outputs
cross over CUDA IPC (``cuda_ipc.py``, on by default on CUDA): then it runs without
namespaces, since two workers that are each PID 1 of their own namespace cannot share
CUDA memory. The candidate's namespaces still hide the reference worker from it.

Not isolated: the file system (the candidate can read what the user can, except what the
sentinel blocks), GPU memory of other processes (the driver's own protection applies), and
CPU/GPU time (no cgroup limits).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kernelarc.env import is_secret, parent_environment
from kernelarc.guard.messages import Ready, Request, ShutdownRequest
from kernelarc.guard.protocol import Channel, ChannelClosed, ChannelTimeout

_PREFIXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "network, pid and mount namespaces",
        ("unshare", "--net", "--pid", "--mount-proc", "--fork", "--kill-child"),
    ),
    (
        "user, network, pid and mount namespaces",
        ("unshare", "--map-root-user", "--net", "--pid", "--mount-proc", "--fork", "--kill-child"),
    ),
    ("network namespace", ("unshare", "--net")),
)


@dataclass(frozen=True)
class Isolation:
    prefix: tuple[str, ...]
    description: str


def probe_isolation(enabled: bool = True) -> Isolation:
    """The strongest namespace set that starts a Python interpreter here."""
    if not enabled:
        return Isolation((), "none (disabled by configuration)")
    for description, prefix in _PREFIXES:
        try:
            r = subprocess.run(
                [*prefix, sys.executable, "-c", "import os"], timeout=20, capture_output=True
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return Isolation(prefix, description)
    return Isolation((), "none (unshare not permitted here)")


def scrubbed_environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in parent_environment().items() if not is_secret(k)}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            # No precompiled headers for Inductor's C++ kernels: torch keeps them under
            # TMPDIR (the guard's scratch, new for every guard, shared by all its workers)
            # and builds them on a process's first C++ compile even when every kernel is a
            # disk-cache hit. On a 2-core CPU, torch.compile of a small RMSNorm took 7.5 s
            # in a candidate worker with warm caches and ~1.9 s without them; cold, 20.6 s
            # against 12.8 s (2026-12-06, docs/GUARD.md). The kernels are the same.
            "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
        }
    )
    env.update(extra)
    return env


class WorkerTimeout(TimeoutError):
    pass


class WorkerCrashed(RuntimeError):
    pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        return f"killed by {signal.Signals(code - 128).name} (exit {code})"
    return f"exited with code {code}"


class WorkerProcess:
    """One worker: ``start()``, ``wait_ready()``, ``request()``, ``close()``/``kill()``."""

    def __init__(
        self,
        role: str,
        *,
        isolation: Isolation,
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        prewarm: str | None = None,
    ) -> None:
        """``prewarm``: the device type (cpu, cuda) a candidate worker prepares torch.compile
        for before its first request (``worker.py --prewarm``), or None."""
        self.role, self.isolation, self.env, self.prewarm = role, isolation, env, prewarm
        self.log_path, self.cwd = log_path, cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: Channel | None = None
        self.ready = False

    def start(self) -> WorkerProcess:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        self.cwd.mkdir(parents=True, exist_ok=True)
        cmd = [
            *self.isolation.prefix,
            sys.executable,
            "-m",
            "kernelarc.guard.worker",
            "--role",
            self.role,
            "--req-fd",
            str(req_r),
            "--resp-fd",
            str(resp_w),
            *(["--prewarm", self.prewarm] if self.prewarm else []),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                pass_fds=(req_r, resp_w),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        os.close(req_r)
        os.close(resp_w)
        self.channel = Channel(resp_r, req_w)
        return self

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        msg = self._recv(timeout, "starting")
        try:
            Ready.model_validate(msg)
        except ValidationError:
            self.kill()
            raise WorkerCrashed(f"{self.role} worker sent {msg!r:.300} instead of ready") from None
        self.ready = True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _recv(self, timeout: float, what: str) -> dict[str, Any]:
        assert self.channel is not None
        try:
            return self.channel.recv(timeout=max(timeout, 0.001))
        except ChannelTimeout:
            self.kill()
            raise WorkerTimeout(
                f"{self.role} worker: no answer to {what} within {timeout:.0f} s"
            ) from None
        except (ChannelClosed, ValueError) as e:
            code = self.proc.wait(timeout=10) if self.proc else None
            self.kill()
            raise WorkerCrashed(
                f"{self.role} worker {_describe_exit(code)} during {what} ({e})\n{self.log_tail()}"
            ) from None

    def request(self, msg: Request, timeout: float) -> dict[str, Any]:
        """Send ``msg`` and return the raw reply (``messages.decode`` checks it)."""
        assert self.channel is not None
        self.wait_ready(timeout)
        try:
            self.channel.send(msg.wire())
        except OSError:
            code = self.proc.wait(timeout=10) if self.proc else None
            self.kill()
            raise WorkerCrashed(
                f"{self.role} worker {_describe_exit(code)} before {msg.op}\n{self.log_tail()}"
            ) from None
        return self._recv(timeout, msg.op)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self, timeout: float = 5.0) -> None:
        if self.alive() and self.channel is not None and self.ready:
            with contextlib.suppress(Exception):
                self.channel.send(ShutdownRequest().wire())
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline and self.alive():
                    time.sleep(0.02)
        self.kill()
