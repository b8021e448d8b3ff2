"""Inductor's compile-worker pool for a candidate's compile pass (``GuardConfig.compile_workers``).

A candidate worker compiles ``torch.compile`` solutions with one thread by default
(``TORCHINDUCTOR_COMPILE_THREADS=1``): Inductor's parallel compile runs in a pool of worker
processes, and the sandbox forbids a candidate to start processes; compiling can then
take most of a workload's time limit (docs/PERFORMANCE.md).

With ``compile_workers`` > 1 the guard runs a *compile pass* before judging a solution that
compiles at run time: the guard starts the pool itself (its own code, under
``Sentinel.harness``), calls the solution once per workload shape on inputs of its own
(outputs discarded; every post-call check still runs, the pool's processes and threads
excepted), then shuts the pool down, sets Inductor back to compiling in-process, and kills
every other process left in the worker's PID namespace — any left is a violation
(``subprocess``): the candidate could have used the pool to start one. Judging (correctness,
timing, re-check) then starts with no process but the worker's own, and Dynamo's cache
holds what the pass compiled. A shape the pass did not cover compiles in-process, as before.

Only with a PID namespace (``isolation.py``): there every process the pool or a job of it
starts is the worker's descendant, or its orphan re-parented to the worker (PID 1), so the
sweep finds it. Without one the pass is skipped (a note says so).

Not covered: while the pool is alive (the pass only), a solution can run code in the pool's
processes (Inductor's pool accepts any job); they are gone before anything is judged or
timed. Files they wrote stay (the file system is not isolated, docs/GUARD.md).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from kernelarc.guard.held_memory import compiled_graphs
from kernelarc.guard.messages import ViolationReport, Warmed, WarmRequest
from kernelarc.guard.sentinel import Violation, child_pids

#: Seconds to wait for the pool's first worker before compiling without it.
READY_TIMEOUT_S = 60.0
#: Dynamo's recompile limits (per function, over all functions) for a shape-specialised
#: compile (``dynamic=False``): one graph per workload shape. At the default (8) Dynamo runs
#: every shape after the 8th eagerly. Raised by the guard's torch.compile baseline
#: (``worker.py``) and by the compiler agent's static variant (in the solution's source).
STATIC_RECOMPILE_LIMIT = 1024
RECOMPILE_LIMIT_KEYS = ("recompile_limit", "accumulated_recompile_limit")


def raise_recompile_limits(dynamo_config: Any) -> None:
    """Raise ``dynamo_config``'s :data:`RECOMPILE_LIMIT_KEYS` to :data:`STATIC_RECOMPILE_LIMIT`."""
    for key in RECOMPILE_LIMIT_KEYS:
        setattr(dynamo_config, key, max(STATIC_RECOMPILE_LIMIT, getattr(dynamo_config, key)))


def namespace_processes() -> list[int]:
    """PIDs of every process visible in ``/proc`` but this one (in a PID namespace: the
    worker's namespace)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            out.append(int(name))
    return sorted(out)


class CompilePool:
    """Start, use and tear down Inductor's compile pool in this (candidate) process."""

    def __init__(self, workers: int) -> None:
        if workers < 2:
            raise ValueError(f"a compile pool needs at least 2 workers, got {workers}")
        self.workers = workers
        self.started = False

    def start(self) -> float:
        """Start the pool and wait (up to ``READY_TIMEOUT_S``) until it takes jobs; seconds
        spent. Call under ``Sentinel.harness``: the pool's process is the guard's."""
        import torch._inductor.config as inductor_config
        from torch._inductor.async_compile import AsyncCompile

        t0 = time.monotonic()
        inductor_config.compile_threads = self.workers
        AsyncCompile.process_pool.cache_clear()
        AsyncCompile.pool.cache_clear()
        AsyncCompile.warm_pool()
        self.started = True
        AsyncCompile.wait_pool_ready(timeout=READY_TIMEOUT_S)
        return time.monotonic() - t0

    def stop(self) -> list[str]:
        """Shut the pool down and compile in-process from now on; then kill every other
        process of the namespace. Returns what had to be killed (``pid: command``), which
        the caller reports as a violation: the pool's own processes are gone by then."""
        import torch._inductor.config as inductor_config
        from torch._inductor.async_compile import AsyncCompile, shutdown_compile_workers

        if self.started:
            shutdown_compile_workers()
        if AsyncCompile.pool.cache_info().currsize:  # its thread pool (C++ compiles)
            AsyncCompile.pool().shutdown(wait=True)
        inductor_config.compile_threads = 1
        AsyncCompile.process_pool.cache_clear()
        AsyncCompile.pool.cache_clear()
        self.started = False
        deadline = time.monotonic() + 5.0
        left = namespace_processes()
        while left and time.monotonic() < deadline:  # the pool's workers exiting
            time.sleep(0.05)
            _reap()
            left = namespace_processes()
        killed = []
        for pid in left:
            what = f"{pid}: {_command(pid)}"
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # it ended on its own meanwhile
            killed.append(what)
        _reap()
        return killed


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _reap() -> None:
    """Collect exited children (and, as PID 1 of a namespace, adopted orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def compile_stats() -> dict[str, Any] | None:
    """torch.compile's work in this process so far, from Dynamo's own counters: graphs
    compiled, seconds in Dynamo's frame compiles, in Inductor, and waiting for its kernels;
    None when nothing was compiled. Diagnostics for the traces only: the solution runs in
    this process and could alter these counters, so no verdict reads them."""
    graphs = compiled_graphs()
    if graphs == 0:
        return None
    if graphs < 0:  # a torch without this counter: said in the trace
        return {"error": "Dynamo's count of compiled graphs cannot be read"}
    try:
        from torch._dynamo.utils import calculate_time_spent

        spent = calculate_time_spent()
    except Exception as e:  # a torch without these timers: said in the trace
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    return {
        "graphs": graphs,
        "compile_s": round(float(spent.get("entire_frame_compile", 0.0)), 2),
        "inductor_s": round(float(spent.get("inductor_compile", 0.0)), 2),
        "kernel_wait_s": round(float(spent.get("async_compile.wait", 0.0)), 2),
    }


def compile_pass(role: Any, msg: WarmRequest) -> Warmed:
    """The candidate worker's ``warm`` request: ``msg.workloads`` (with ``msg.seeds``, one
    per workload) each called once with the pool up, none started after ``msg.max_s``
    seconds; then the pool torn down. ``role`` is the
    :class:`~kernelarc.guard.candidate.CandidateRole`. A call that raises is only a note: the
    same call in the first correctness round gets the verdict. Skipped (a note) unless this
    worker is PID 1 of its namespace: the sweep kills every other process it can see."""
    import torch

    sentinel, device = role.sentinel, role.device
    workers = msg.workers
    if os.getpid() != 1:  # the sweep below would reach processes outside the worker
        return Warmed(
            ok=True,
            seconds=0.0,
            called=[],
            notes=["compile pass skipped: the worker is not PID 1 of a PID namespace"],
        )
    pool = CompilePool(workers)
    found: list[Violation] = []
    notes: list[str] = []
    called: list[str] = []
    t0 = time.monotonic()
    try:
        with sentinel.harness():
            try:
                ready_s = pool.start()
            except Exception as e:  # the library's failure, not the candidate's
                notes.append(f"compile pass skipped: the compile pool did not start ({e})"[:300])
                return Warmed(ok=True, seconds=0.0, called=[], notes=notes)
            sentinel.adopt(set(child_pids()))
        for wl, seed in zip(msg.workloads, msg.seeds, strict=True):
            if time.monotonic() - t0 > msg.max_s:  # the rest compile when judged
                break
            called.append(wl.uuid)
            with sentinel.harness():
                inputs = role.generate(wl, seed)
                outputs = role.alloc_outputs(wl) if role.dps else []
            try:
                role.call(inputs, outputs)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as e:  # judged in its first correctness round
                notes.append(f"compile pass: {dict(wl.axes)} raised {type(e).__name__}: {e}"[:300])
            # Threads are checked once the pool is down: Inductor's own helper threads
            # start inside the calls and end with the pool; any other left is a finding.
            found += [v for v in sentinel.check_after_call() if v.check != "threads"]
            del inputs, outputs
    finally:
        with sentinel.harness():
            killed = pool.stop()
            sentinel.adopt(set())
    found += sentinel.check_after_call()
    if killed:
        found.append(
            Violation("subprocess", f"processes left after the compile pass: {killed}"[:500])
        )
    seconds = time.monotonic() - t0
    notes.insert(
        0,
        f"compile pass: {len(called)} workload(s) called once with {workers} "
        f"Inductor compile workers ({seconds:.1f} s, the pool ready in {ready_s:.1f} s) "
        "before judging; the pool was then shut down",
    )
    return Warmed(
        ok=True,
        seconds=seconds,
        called=called,
        notes=notes,
        violations=[
            ViolationReport(check=v.check, detail=v.detail) for v in found + sentinel.take()
        ],
    )


__all__ = [
    "READY_TIMEOUT_S",
    "RECOMPILE_LIMIT_KEYS",
    "STATIC_RECOMPILE_LIMIT",
    "CompilePool",
    "compile_pass",
    "namespace_processes",
    "raise_recompile_limits",
]
