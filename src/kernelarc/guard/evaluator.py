"""The benchmark guard: one protocol that alone decides whether a candidate is correct and
how fast it is.

``Guard(problem, GuardConfig)`` owns a trusted *reference* worker (kept for the guard's
lifetime; its reference outputs are cached across candidates) and one fresh *candidate*
worker per solution (replaced after any failure). Per workload: ``rounds`` correctness
rounds on fresh inputs from fixed derived seeds, then timing (warm-up + timed calls over a
pool of distinct inputs), verification of sampled timed outputs, a re-check on fresh inputs,
and the reference timed with the same protocol in a candidate worker of its own. Everything
the verdict depends on is computed outside the candidate's process; the same candidate on
the same device gets the same statuses (latencies vary within the measured noise).

Status precedence per workload: a reward-hack finding beats every other status; then the
first failing round's status. A workload that times out ends the evaluation: the workloads
after it are reported TIMEOUT, ``not run``. See ``docs/GUARD.md``.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import site
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelarc.env import cache_dir as default_cache_dir
from kernelarc.errors import KernelArcError
from kernelarc.guard.config import EvalResult, GuardConfig, resolve_device
from kernelarc.guard.cupti import cupti_available
from kernelarc.guard.footprint import device_bytes
from kernelarc.guard.footprint import one_timed_call as footprint_one_timed_call
from kernelarc.guard.interleave import interleaved_compare
from kernelarc.guard.isolation import (
    Isolation,
    WorkerCrashed,
    WorkerProcess,
    WorkerTimeout,
    probe_isolation,
    scrubbed_environment,
)
from kernelarc.guard.messages import (
    CandidateTimed,
    Done,
    Emulated,
    EmulatedRequest,
    ErrorReply,
    MalformedReply,
    Policy,
    ReferenceReady,
    ReferenceSetup,
    ReferenceTimed,
    ReleaseRequest,
    decode,
)
from kernelarc.guard.noise import Decision
from kernelarc.guard.scratch import make_scratch, sweep_stale
from kernelarc.guard.session import CandidateSession, SessionSettings
from kernelarc.guard.verdict import (
    REFERENCE_FAILED,
    Verdict,
    WorkloadOutcome,
    hack,
    make_trace,
)
from kernelarc.problem.loader import Problem
from kernelarc.problem.reference import reference_solution
from kernelarc.problem.schema import EvaluationStatus, Solution, Trace, Workload

#: How the log of a workload that was not run starts (:func:`not_run`).
NOT_RUN = "not run: "


def not_run(wl: Workload, timed_out: str) -> WorkloadOutcome:
    """The outcome of a workload left unjudged because workload ``timed_out`` (a uuid) timed
    out before it: TIMEOUT, never a pass nor a timing; its log says so."""
    return WorkloadOutcome(
        workload=wl,
        status=EvaluationStatus.TIMEOUT,
        log=f"{NOT_RUN}an earlier workload timed out ({timed_out})",
    )


def _library_roots(cache: Path) -> list[str]:
    roots = {
        sys.prefix,
        sys.base_prefix,
        str(cache),
        "/usr",
        "/lib",
        "/lib64",
        "/opt",
        "/usr/local",
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
    with contextlib.suppress(Exception):
        roots.update(site.getsitepackages())
    return sorted(str(Path(r).resolve()) for r in roots if r)


class Guard:
    """Judge solutions of one problem. Use as a context manager (workers are closed)."""

    def __init__(self, problem: Problem, config: GuardConfig | None = None) -> None:
        self.problem = problem
        self.config = config or GuardConfig()
        self.device = resolve_device(self.config.device)
        self.cache = (self.config.cache_dir or default_cache_dir()).resolve()
        self.cache.mkdir(parents=True, exist_ok=True)
        shm = Path("/dev/shm")
        base = str(shm) if shm.is_dir() and shm.stat().st_mode & 0o002 else None
        # Folders of guards that were killed before they could close go first (scratch.py).
        sweep_stale("kernelarc-guard-", base)
        sweep_stale("kernelarc-refcache-")
        self.tmp = make_scratch("kernelarc-guard-", base)
        # The reference worker compiles (the torch.compile baseline) with caches of its own,
        # fresh for this guard: candidates write the shared caches, and an entry they plant
        # there must not become the baseline's code. Not under ``tmp``, whose path the
        # candidate's TMPDIR gives away (docs/GUARD.md, "What is not covered").
        self._ref_cache = make_scratch("kernelarc-refcache-")
        self.isolation: Isolation = probe_isolation(self.config.isolation)
        self._ref: WorkerProcess | None = None
        self._spare: WorkerProcess | None = None
        self._closed = False
        self._ref_env: dict[str, Any] = {}
        self._ref_times: dict[tuple[Any, ...], tuple[dict[str, Any], str | None]] = {}
        self._ref_timer: CandidateSession | None = None
        self._workers = 0
        self._use_cupti = self._cupti_wanted()
        early = self.config.early_spare
        self._early_spare = self.config.warm_spare and (
            self.device.startswith("cuda") if early is None else early
        )
        self.gpu_exchange = self.config.gpu_exchange and self.device.startswith("cuda")
        """Large CUDA outputs cross to the reference worker on the GPU (``cuda_ipc.py``);
        turned off for the guard's life when the environment refuses it."""
        # Both kinds of worker start now, in parallel: the reference (set up on first use)
        # and the first candidate's process (torch imported while the caller goes on).
        self._ref_started: WorkerProcess | None = self._new_worker("reference")
        self._spare = self._new_worker("candidate")
        # and the worker that times the reference as a candidate (reference_timing)
        self._timer_started: WorkerProcess | None = (
            self._new_worker("candidate") if self.config.time_reference else None
        )

    def _cupti_wanted(self) -> bool:
        if self.config.cupti == "off" or not self.device.startswith("cuda"):
            return False
        ok = cupti_available()
        if self.config.cupti == "on" and not ok:
            raise KernelArcError(
                "--cupti on: cupti-python is not importable here; install "
                "it (pip install cupti-python) or use --cupti auto"
            )
        return ok

    # ------------------------------------------------------------------ workers
    def _env(self, role: str, jit_cache: Path | None = None) -> dict[str, str]:
        cache = self._ref_cache if role == "reference" else (jit_cache or self.cache)
        # The reference's TMPDIR is private too: torch keeps more Inductor caches under
        # TMPDIR whatever TORCHINDUCTOR_CACHE_DIR says (its default cache folder)
        scratch = self._ref_cache if role == "reference" else self.tmp
        extra = {
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "TORCH_EXTENSIONS_DIR": str(self.cache / "torch_extensions"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TMPDIR": str(scratch / "scratch"),
        }
        if self.device == "cpu":
            extra["TRITON_INTERPRET"] = "1"
        return scrubbed_environment(extra)

    def _new_worker(self, role: str, jit_cache: Path | None = None) -> WorkerProcess:
        self._workers += 1
        n = self._workers
        env = self._env(role, jit_cache)
        Path(env["TMPDIR"]).mkdir(exist_ok=True)
        return WorkerProcess(
            role,
            isolation=self._isolation_of(role),
            env=env,
            log_path=self.tmp / f"{role}-{n}.log",
            cwd=self.tmp / f"{role}-{n}",
            prewarm=self.device.split(":")[0]
            if role == "candidate" and self._early_spare
            else None,
        ).start()

    def _isolation_of(self, role: str) -> Isolation:
        """Candidates get the probed isolation. The reference worker (the problem's own code)
        gets the same, except with the CUDA IPC exchange: a worker in its own PID namespace
        is PID 1 there, as is the candidate, and the driver then takes the candidate's handle
        for one of the reader's own (error 201). The candidate's namespaces still hide the
        reference worker from it."""
        if role == "reference" and self.gpu_exchange:
            return Isolation((), "none (the reference worker, for CUDA IPC)")
        return self.isolation

    def reference(self) -> WorkerProcess:
        if self._ref is not None and self._ref.alive():
            return self._ref
        ref, self._ref_started = self._ref_started, None
        if ref is None or not ref.alive():
            ref = self._new_worker("reference")
        setup = ReferenceSetup(
            device=self.device,
            definition=self.problem.definition,
            problem_root=str(self.problem.root),
            cache_bytes=(4 << 30) if self.device.startswith("cuda") else (1 << 30),
        )
        raw = ref.request(setup, timeout=self.config.setup_timeout)
        try:
            reply = decode(raw, ReferenceReady)
        except MalformedReply as e:
            ref.kill()
            name = self.problem.definition.name
            raise KernelArcError(f"the reference worker of {name}: {e}") from None
        if isinstance(reply, ErrorReply):
            ref.kill()
            raise KernelArcError(
                f"the reference of {self.problem.definition.name} does not "
                f"load: {reply.message}\n{reply.traceback}"
            )
        self._ref_env = reply.environment
        self._ref = ref
        return ref

    def candidate_worker(self, fresh_jit: bool = False) -> WorkerProcess:
        """A started candidate worker (the warm spare when there is one). ``fresh_jit``: a
        new worker whose Triton and Inductor caches start empty (under this guard's temporary
        directory) instead of the shared ones: what it compiles and autotunes, it does
        afresh, as a new user process does (``orchestration/confirm.py``)."""
        if fresh_jit:
            return self._new_worker(
                "candidate", Path(tempfile.mkdtemp(prefix="jit-cache-", dir=self.tmp))
            )
        if self._spare is not None and self._spare.alive():
            w, self._spare = self._spare, None
        else:
            w = self._new_worker("candidate")
        if self._early_spare:
            self.prepare_spare()
        return w

    def prepare_spare(self) -> None:
        """Start the warm spare candidate worker (with ``warm_spare``; not after ``close``).
        Called when a candidate is done with its worker; with ``early_spare`` also as soon
        as one takes its worker. Not early on the CPU: a spare that imports torch on a core
        the timed calls share slowed them (the CPU runs' reference-as-candidate readings)."""
        if not self.config.warm_spare or self._closed:
            return
        if self._spare is None or not self._spare.alive():
            self._spare = self._new_worker("candidate")

    def policy(self) -> Policy:
        """What the candidate's sentinel forbids: the problem's files (its reference)."""
        return Policy(
            forbidden_roots=[str(self.problem.root.resolve())],
            problem_name=self.problem.definition.name,
            library_roots=_library_roots(self.cache),
        )

    def settings(self, config: GuardConfig | None = None) -> SessionSettings:
        """A session's settings: ``config`` (default: the guard's) and the guard's current
        choices for CUDA IPC and CUPTI."""
        return SessionSettings(
            config=config or self.config, gpu_exchange=self.gpu_exchange, cupti=self._use_cupti
        )

    def environment(self) -> dict[str, Any]:
        env = dict(self._ref_env or {"hardware": self.device, "libs": {}})
        return env

    def _emulated_note(self) -> list[str]:
        """``reference ran emulated: <ops>`` when the reference worker emulated low-precision
        ops the device lacks (``problem/emulation.py``); nothing when it emulated none."""
        if self._ref is None or not self._ref.alive():
            return []  # it crashed: its workloads are INVALID_REFERENCE already
        raw = self._ref.request(EmulatedRequest(), timeout=self.config.setup_timeout)
        try:
            reply = decode(raw, Emulated)
        except MalformedReply as e:
            raise KernelArcError(f"reference worker: {e}") from None
        if isinstance(reply, ErrorReply):
            raise KernelArcError(f"reference worker: {reply.message}")
        ops = reply.ops
        return [f"reference ran emulated: {', '.join(ops)}"] if ops else []

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self,
        solution: Solution,
        workloads: list[Workload] | None = None,
        *,
        rounds: int | None = None,
        warmup: int | None = None,
        iterations: int | None = None,
        stop: Callable[[WorkloadOutcome], str | None] | None = None,
        session: CandidateSession | None = None,
        retime_reference: bool = False,
        warm_budget_s: float | None = None,
        fresh_jit: bool = False,
        on_trace: Callable[[Trace], None] | None = None,
    ) -> EvalResult:
        """Judge ``solution`` on ``workloads`` (all by default). ``rounds``/``warmup``/
        ``iterations`` override the configuration for this call (the search's screening
        stage; an ``iterations`` override also turns off the extension for tiny kernels).
        ``stop(outcome)`` is asked after each workload; a non-None answer (the reason) ends
        the evaluation early: the remaining workloads are not judged. ``retime_reference``
        times the reference again on each workload (``GuardConfig.retime_reference``).
        ``warm_budget_s`` caps the compile pass (``GuardConfig.compile_workers``; a search's
        time left): no call of it starts later. ``fresh_jit``: the candidate's worker starts
        with empty Triton and Inductor caches (:meth:`candidate_worker`; not with ``session``).

        A workload that times out ends the evaluation when ``stop`` does not: each remaining
        workload gets a TIMEOUT trace whose log starts with ``not run:`` (:func:`not_run`),
        without performance figures, so a hanging solution costs one time limit, not one per
        workload; ``stopped_early`` names the workload. ``on_trace(trace)`` is called with
        each workload's trace as soon as it is judged (``kernelarc eval -o`` writes it then).

        ``session`` (from :meth:`open_session` for the same solution) keeps the candidate's
        worker between calls, e.g. the search's screening and full stages: the solution is
        not built, loaded or compiled again (torch.compile candidates compiled per shape).
        Its worker is still replaced after any failure; the caller closes it. Without one,
        each call has a worker of its own."""
        t0 = time.monotonic()
        chosen = list(workloads) if workloads is not None else list(self.problem.workloads)
        update: dict[str, Any] = {
            k: v
            for k, v in (("rounds", rounds), ("warmup", warmup), ("iterations", iterations))
            if v is not None
        }
        if iterations is not None:  # a quick stage: exactly the calls asked for
            update["min_timed_ms"] = 0.0
        if retime_reference:
            update["retime_reference"] = True
        cfg = self.config.model_copy(update=update) if update else self.config
        self.reference()  # set up first: a reference that does not load is the user's error,
        # and every trace (even a COMPILE_ERROR one) then names the real hardware
        held = session is not None
        if held and fresh_jit:
            raise ValueError("evaluate(fresh_jit=True) starts its own worker: no session")
        settings = self.settings(cfg)
        settings.fresh_jit = fresh_jit
        if session is None:
            session = CandidateSession(self, solution, settings)
        elif session.solution.content_hash() != solution.content_hash():
            raise ValueError("evaluate(session=...): the session is for another solution")
        else:
            session.settings = settings
        before = session.reported  # a held session's phases of earlier calls (build first)
        outcomes: list[WorkloadOutcome] = []
        traces: list[Trace] = []
        stopped: str | None = None

        def report(o: WorkloadOutcome) -> None:
            traces.append(
                make_trace(
                    self.problem.definition.name,
                    solution.name,
                    o,
                    self.environment(),
                    self.isolation.description,
                )
            )
            outcomes.append(o)
            if on_trace is not None:
                on_trace(traces[-1])

        try:
            session.warm(chosen, warm_budget_s)
            for i, wl in enumerate(chosen):
                outcome = session.evaluate_workload(wl)
                outcome.notes += self._emulated_note()
                report(outcome)
                stopped = stop(outcome) if stop is not None else None
                if stopped:
                    break
                if outcome.status == EvaluationStatus.TIMEOUT:
                    stopped = f"TIMEOUT on workload {wl.uuid}"
                    for rest in chosen[i + 1 :]:
                        report(not_run(rest, wl.uuid))
                    break
        finally:
            if not session.settings.gpu_exchange:  # CUDA IPC failed: files from now on
                self.gpu_exchange = False
            if not held:
                session.close()
        session.reported = dict(session.phases)  # (closing a session starts the spare)
        return EvalResult(
            stopped_early=stopped,
            solution=solution.name,
            traces=traces,
            outcomes=outcomes,
            wall_s=time.monotonic() - t0,
            phases_s={
                k: v - before.get(k, 0.0)
                for k, v in session.phases.items()
                if v - before.get(k, 0.0) > 0
            },
        )

    def open_session(self, solution: Solution) -> CandidateSession:
        """A candidate session to pass to several :meth:`evaluate` calls of ``solution``
        (built now; its worker starts on first use). Close it (``.close()``) when done."""
        return CandidateSession(self, solution)

    def compare(
        self,
        candidate: Solution,
        incumbent: Solution,
        workloads: list[Workload] | None = None,
        *,
        processes: int = 4,
        min_gain: float = 0.01,
        z: float = 3.0,
    ) -> Decision:
        """Noise-aware ``is candidate better than incumbent``: both are timed in alternation,
        each in ``processes`` (at least 3) new workers of its own, over the same input pool
        (``guard/interleave.py``; the rule: ``guard/noise.py``). Judge correctness with
        :meth:`evaluate` first; a failure or reward-hack finding here raises ``Verdict``."""
        chosen = list(workloads) if workloads is not None else list(self.problem.workloads)
        return interleaved_compare(
            self, candidate, incumbent, chosen, processes=processes, min_gain=min_gain, z=z
        )

    @functools.cached_property
    def device_memory(self) -> int | None:
        """The device's memory in bytes (None on the CPU), read once."""
        return device_bytes(self.device)

    def one_timed_call(self, wl: Workload) -> bool:
        """Whether only the last timed call of ``wl`` is judged on this device
        (``footprint.one_timed_call``)."""
        return footprint_one_timed_call(self.problem.definition, wl, self.device_memory)

    def reference_timing(
        self,
        wl: Workload,
        compiled: bool,
        seeds: list[int],
        deadline: float,
        cfg: GuardConfig | None = None,
        *,
        one_sample: bool = False,
        notes: list[str] | None = None,
    ) -> dict[str, Any]:
        """The reference (or its torch.compile) timed on ``wl`` with the timing protocol of
        ``cfg`` (default: the guard's): the same warm-up and timed calls as the candidate it
        is compared with. The eager reference is timed as a candidate
        (:meth:`_time_as_candidate`; ``one_sample`` as the candidate's request), its
        torch.compile in the reference worker; a note on how it was timed, if any, goes to
        ``notes``. Cached per workload and protocol for the guard's lifetime, unless
        ``cfg.retime_reference`` asks for a new timing (which then replaces the cached one).
        The protocol is part of the key: a reference timed with other call counts than the
        candidate misreads the ratio (docs/GUARD.md)."""
        cfg = cfg or self.config
        protocol = (cfg.warmup, cfg.iterations, cfg.min_timed_ms, cfg.max_iterations)
        key = (wl.uuid, compiled, *protocol, cfg.max_timed_ms, cfg.pool_sets)
        timed: dict[str, Any] | None = None
        note = None
        if key in self._ref_times and not cfg.retime_reference:
            timed, note = self._ref_times[key]
        elif not compiled:
            timed, note = self._time_as_candidate(wl, seeds, deadline, cfg, one_sample)
        if timed is None:
            ref = self.reference()
            request = cfg.time_request(
                wl,
                seeds,
                compiled=compiled,
                cupti=self._use_cupti,
            )
            raw = ref.request(request, timeout=max(deadline - time.monotonic(), 1.0))
            try:
                reply = decode(raw, ReferenceTimed)
            except MalformedReply as e:
                raise hack("check-error", f"timing the reference: {e}") from None
            if isinstance(reply, ErrorReply):
                raise Verdict("INVALID_REFERENCE", f"timing {REFERENCE_FAILED}: {reply.message}")
            timed = reply.summary
        self._ref_times[key] = (timed, note)
        if note is not None and notes is not None:
            notes.append(note)
        return timed

    def _timer_worker(self) -> WorkerProcess:
        w, self._timer_started = self._timer_started, None
        return w if w is not None and w.alive() else self._new_worker("candidate")

    def _time_as_candidate(
        self, wl: Workload, seeds: list[int], deadline: float, cfg: GuardConfig, one: bool
    ) -> tuple[dict[str, Any] | None, str | None]:
        """The eager reference timed as the candidate is: the reference solution in a
        candidate worker of its own (kept for the guard's life, sandboxed and audited as
        candidates are), with the candidate's request, seeds and settings. ``(summary,
        None)``, or ``(None, why)`` when it cannot run as a candidate (e.g. it needs ops the
        reference worker emulates): the reference worker then times it. A missed deadline
        is the candidate's TIMEOUT, as any reference timing's."""
        if self._ref_timer is None:
            solution = reference_solution(
                self.problem.definition, agent="guard", description="the reference, timed"
            )
            self._ref_timer = CandidateSession(self, solution, spawn=self._timer_worker)
        timer = self._ref_timer
        timer.settings = self.settings(cfg)
        exchange = self.tmp / "reference-timing"  # its sampled outputs, never judged
        exchange.mkdir(exist_ok=True)
        request = cfg.time_request(
            wl,
            seeds,
            one_sample=one,
            exchange_dir=str(exchange),
            ipc=timer.settings.gpu_exchange,
            cupti=self._use_cupti,
        )
        try:
            if timer.fatal is not None:
                raise timer.fatal
            reply = timer.cand(request, CandidateTimed, deadline, "the reference's timing")
            timer.cand(ReleaseRequest(), Done, deadline, "release")
        except WorkerTimeout:
            timer.drop_worker()
            raise
        except (Verdict, WorkerCrashed) as e:
            timer.drop_worker()
            why = e.log if isinstance(e, Verdict) else str(e)
            return None, f"reference timed in the reference worker: as a candidate: {why}"[:500]
        return dict(reply.summary), None

    def close(self) -> None:
        self._closed = True
        if self._ref_timer is not None:
            self._ref_timer.close()
        for w in (self._ref, self._spare, self._ref_started, self._timer_started):
            if w is not None:
                w.close()
        self._ref = self._spare = self._ref_started = self._timer_started = None
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self._ref_cache, ignore_errors=True)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "NOT_RUN",
    "EvalResult",
    "Guard",
    "GuardConfig",
    "WorkerCrashed",
    "WorkerTimeout",
    "not_run",
]
