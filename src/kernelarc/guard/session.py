"""One solution's evaluation: build, load in a fresh candidate worker, judge each workload.

The per-workload protocol (all seeds from ``protocol.derive_seed``):

1. ``rounds`` correctness rounds: the reference worker and the candidate worker generate
   the same inputs from the round's seed; the candidate's outputs go to the reference
   worker, which judges them with the official rules (``compare.py``).
2. Timing: ``warmup`` + ``iterations`` calls over a pool of distinct input sets; the
   outputs of two sampled timed calls are judged too (stale or cached results fail).
3. A re-check round on fresh inputs after timing.
4. The reference timed with the same protocol, right after the candidate, in a candidate
   worker of its own running the reference solution (``Guard.reference_timing``; cached per
   workload and protocol for the guard's life).

Any violation reported by the sentinel, at any step, makes the workload REWARD_HACK. A
crash or a missed deadline kills the worker (RUNTIME_ERROR / TIMEOUT for that workload) and
the next workload gets a fresh worker; so does any other failure.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kernelarc.guard.build import choose_builder
from kernelarc.guard.build_base import BuildError
from kernelarc.guard.config import GuardConfig
from kernelarc.guard.isolation import Isolation, WorkerCrashed, WorkerProcess, WorkerTimeout
from kernelarc.guard.messages import (
    Artifact,
    CandidateRan,
    CandidateReady,
    CandidateSetup,
    CandidateTimed,
    Compared,
    CompareRequest,
    Done,
    ErrorReply,
    MalformedReply,
    Policy,
    ReferenceRan,
    ReleaseRequest,
    Reply,
    Request,
    RunRequest,
    ViolationReport,
    Warmed,
    WarmRequest,
    decode,
)
from kernelarc.guard.protocol import (
    POOL_ROUND_BASE,
    RECHECK_ROUND,
    ROUND_PARTS,
    WARM_ROUND,
    derive_seed,
)
from kernelarc.guard.static_scan import static_scan
from kernelarc.guard.verdict import (
    REFERENCE_FAILED,
    Verdict,
    WorkloadOutcome,
    check_writes,
    from_violations,
    hack,
    merge_errors,
    reply_verdict,
)
from kernelarc.problem.loader import Problem
from kernelarc.problem.schema import EvaluationStatus, Solution, Workload

R = TypeVar("R", bound=Reply)


@dataclasses.dataclass
class SessionSettings:
    """What one session judges with: the guard's configuration (or a call's overrides of
    it), and the choices the guard made for its workers. A session changes only its own
    (``gpu_exchange`` off once CUDA IPC fails); the guard reads that back after the call."""

    config: GuardConfig
    gpu_exchange: bool = False
    """Large CUDA outputs cross to the reference worker on the GPU (``cuda_ipc.py``)."""
    cupti: bool = False
    """Timed calls are read with CUPTI (``cupti.py``)."""
    fresh_jit: bool = False
    """Every worker of the session starts with empty JIT caches (``Guard.evaluate``)."""


class GuardSide(Protocol):
    """What a session uses of its guard (``evaluator.Guard``): the workers, the problem,
    the reference's timings and the guard's scratch and caches."""

    problem: Problem
    device: str
    tmp: Path
    cache: Path
    isolation: Isolation

    def settings(self, config: GuardConfig | None = None) -> SessionSettings: ...

    def reference(self) -> WorkerProcess: ...

    def candidate_worker(self, fresh_jit: bool = False) -> WorkerProcess: ...

    def prepare_spare(self) -> None: ...

    def policy(self) -> Policy: ...

    def one_timed_call(self, wl: Workload) -> bool: ...

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
    ) -> dict[str, Any]: ...


def lowers_precision(flag: str, value: Any) -> bool:
    """Whether a changed precision switch (or the observed error level) means float32 work
    ran below float32: TF32 or bf16 matmuls, reduced-precision reductions. Pinning full
    precision (``"ieee"``, ``"highest"``, ``False``) is not a downgrade."""
    if flag == "observed_error_level":
        return True
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    return not (text in ("ieee", "highest", "none") or text.startswith("unreadable"))


MIN_PASS_S = 20.0
"""The least budget (seconds) a compile pass starts with: Inductor's pool alone takes about
10 s to start (docs/GUARD.md), and a pass started with less calls nothing."""

_KEEP = (EvaluationStatus.INVALID_REFERENCE, EvaluationStatus.REWARD_HACK)
_CHECK_STATUS = {
    "shape": "INCORRECT_SHAPE",
    "dtype": "INCORRECT_DTYPE",
    "numerical": "INCORRECT_NUMERICAL",
}


class ExchangeFailed(RuntimeError):
    """The reference worker could not open a CUDA IPC handle (the environment's doing)."""


class CandidateSession:
    """One solution judged by ``guard``: built now, loaded in a candidate worker on first
    use, which is replaced after any failure. ``settings`` default to the guard's.
    ``spawn`` starts its workers (default: the guard's ``candidate_worker``, which hands
    out the warm spare)."""

    def __init__(
        self,
        guard: GuardSide,
        solution: Solution,
        settings: SessionSettings | None = None,
        spawn: Callable[[], WorkerProcess] | None = None,
    ) -> None:
        self.guard, self.solution = guard, solution
        self.settings = settings or guard.settings()
        self.spawn = spawn
        self.phases: dict[str, float] = {}
        self.reported: dict[str, float] = {}
        """The phases as already reported by earlier ``Guard.evaluate`` calls of a held
        session (each call reports its own share)."""
        self.worker: WorkerProcess | None = None
        self.fatal: Verdict | None = None  # decided for every workload (build/import)
        self.artifact: Artifact | None = None
        self.setup_notes: list[str] = []
        self.precision: dict[str, Any] = {}
        self.warmed: set[str] = set()
        """Workloads the compile pass has called (``warm``)."""
        self.warm_notes: list[str] = []
        self._build()

    @property
    def cfg(self) -> GuardConfig:
        return self.settings.config

    def _add_parts(self, prefix: str, given: dict[str, float], parts: tuple[str, ...]) -> None:
        """Adds a worker reply's ``phases_s`` (where its time went: diagnostics, never a
        verdict; unknown or negative entries are left out) to :attr:`phases`."""
        for part, secs in given.items():
            if part in parts and secs >= 0:
                key = f"{prefix}.{part}"
                self.phases[key] = self.phases.get(key, 0.0) + float(secs)

    def _tick(self, phase: str, t0: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + time.monotonic() - t0

    # ------------------------------------------------------------------ build & load
    def _build(self) -> None:
        t0 = time.monotonic()
        sources = {s.path: s.content for s in self.solution.sources}
        found = static_scan(sources)
        if found:
            self.fatal = hack(found[0].check, found[0].detail)
            return
        try:
            builder = choose_builder(self.solution)
            art = builder.build(
                self.solution,
                work_dir=self.guard.tmp / "build",
                cache_dir=self.guard.cache,
                timeout=self.cfg.build_timeout,
            )
        except BuildError as e:
            self.fatal = Verdict("COMPILE_ERROR", f"{e}\n{e.log}".strip())
            return
        finally:
            self._tick("build", t0)
        self.artifact = Artifact(**dataclasses.asdict(art))

    def _ask(
        self, worker: WorkerProcess, msg: Request, expected: type[R], timeout: float, what: str
    ) -> R | ErrorReply:
        """``msg`` answered by ``worker``, checked: a reply that fits neither ``expected``
        nor an error reply is a crashed check, which rejects the candidate."""
        raw = worker.request(msg, timeout=timeout)
        try:
            return decode(raw, expected)
        except MalformedReply as e:
            raise hack("check-error", f"{what}: {e}") from None

    def _ensure_worker(self) -> WorkerProcess:
        if self.worker is not None and self.worker.alive():
            return self.worker
        assert self.artifact is not None, "a session whose build failed loads nothing"
        t0 = time.monotonic()
        if self.spawn is not None:
            w = self.spawn()
        else:
            w = self.guard.candidate_worker(self.settings.fresh_jit)
        try:
            w.wait_ready(self.cfg.setup_timeout)
            self._tick("process_start", t0)
            t1 = time.monotonic()
            setup = CandidateSetup(
                device=self.guard.device,
                definition=self.guard.problem.definition,
                dps=self.solution.spec.destination_passing_style,
                artifact=self.artifact,
                policy=self.guard.policy(),
            )
            try:
                reply = self._ask(
                    w, setup, CandidateReady, self.cfg.setup_timeout, "loading the solution"
                )
            except Verdict:
                w.kill()
                raise
            self._tick("load", t1)
            self._record_setup_timings(reply.timings)
        except WorkerTimeout as e:
            raise Verdict("TIMEOUT", f"loading the solution: {e}") from None
        except WorkerCrashed as e:
            raise Verdict("RUNTIME_ERROR", f"loading the solution crashed: {e}") from None
        bad = from_violations(reply.violations)
        if bad is not None:
            w.kill()
            self.fatal = bad
            raise bad
        if isinstance(reply, ErrorReply):
            w.kill()
            if reply.error == "compile":
                self.fatal = Verdict("COMPILE_ERROR", f"{reply.message}\n{reply.log}")
                raise self.fatal
            raise reply_verdict(reply)
        self.precision = dict(reply.precision)
        self.setup_notes = list(reply.notes)
        self.worker = w
        return w

    def _record_setup_timings(self, timings: dict[str, float]) -> None:
        """The worker's own account of its setup (diagnostics, never the verdict): the
        solution's import (``load.entry``), torch.compile's preparation inside the setup
        (``load.prewarm``) or done by the spare before it (``spare_prewarm``, not part of
        this candidate's time unless the spare was taken before it finished)."""
        names = {"entry": "load.entry", "prewarm": "load.prewarm", "spare_prewarm": "spare_prewarm"}
        for key, phase in names.items():
            if key in timings:
                self.phases[phase] = self.phases.get(phase, 0.0) + float(timings[key])

    # ------------------------------------------------------------------ compile pass
    def warm(self, workloads: list[Workload], budget_s: float | None = None) -> None:
        """The compile pass (``compile_pool.py``) over the workloads not yet warmed in this
        session, when ``compile_workers`` > 1, the solution compiles at run time and the
        worker has a PID namespace, with at least ``MIN_PASS_S`` of budget; no call starts
        after ``budget_s`` (or one workload's time limit). A finding makes every workload
        REWARD_HACK (``fatal``); a worker that dies or hangs here is replaced and judging
        goes on (compiling then happens in the first calls), with a note."""
        cfg, guard = self.cfg, self.guard
        todo = [w for w in workloads if w.uuid not in self.warmed]
        max_s = cfg.timeout if budget_s is None else min(cfg.timeout, budget_s)
        if cfg.compile_workers < 2 or not todo or self.fatal is not None:
            return
        if not self.solution.compiles_at_run_time():
            return
        if max_s < MIN_PASS_S:  # the pool's start alone would spend the budget
            self.warm_notes = [
                f"compile pass skipped: {max_s:.1f} s left, under the {MIN_PASS_S:.0f} s it "
                "needs to be of use (the pool alone starts in ~10 s)"
            ]
            return
        if "pid" not in guard.isolation.description:
            self.warm_notes = [
                "compile pass skipped: it needs a PID namespace "
                f"(isolation here: {guard.isolation.description})"
            ]
            return
        t0 = time.monotonic()
        msg = WarmRequest(
            workers=cfg.compile_workers,
            workloads=todo,
            seeds=[derive_seed(cfg.seed, w.uuid, WARM_ROUND) for w in todo],
            # Calls start within one workload's time limit (and the caller's budget): past
            # it, the remaining shapes compile when judged.
            max_s=max_s,
        )
        try:
            w = self._ensure_worker()
            raw = w.request(msg, timeout=2 * cfg.timeout)
        except Verdict:
            return  # the solution does not load: each workload's own attempt reports it
        except (WorkerTimeout, WorkerCrashed) as e:
            self.drop_worker()
            self.warm_notes = [f"compile pass failed ({type(e).__name__}: {e}); compiled "
                               "in the first calls instead"[:400]]  # fmt: skip
            return
        finally:
            self._tick("compile_pass", t0)
        try:
            reply = decode(raw, Warmed)
        except MalformedReply as e:
            self.drop_worker()
            self.fatal = hack("check-error", f"compile pass: {e}")
            return
        bad = from_violations(reply.violations)
        if bad is not None:
            self.drop_worker()
            self.fatal = bad
            return
        if isinstance(reply, ErrorReply):
            self.drop_worker()
            self.warm_notes = [f"compile pass failed: {reply.message}"[:400]]
            return
        self.warmed |= set(reply.called)
        self.warm_notes = list(reply.notes)

    # ------------------------------------------------------------------ one workload
    def evaluate_workload(self, wl: Workload) -> WorkloadOutcome:
        outcome = WorkloadOutcome(workload=wl, status=EvaluationStatus.PASSED)
        if wl.tolerance.ignored_keys:
            outcome.notes.append(
                f"tolerance keys ignored as the official harness does: "
                f"{wl.tolerance.ignored_keys}; matched ratio 0.99 enforced"
            )
        deadline = time.monotonic() + self.cfg.timeout
        try:
            if self.fatal is not None:
                raise self.fatal
            try:
                self._judge(wl, outcome, deadline)
            except ExchangeFailed as e:  # judged again from the start, through files
                self.settings.gpu_exchange = False
                outcome.notes.append(f"outputs cross through files: CUDA IPC failed ({e})")
                outcome.correctness = None
                self._judge(wl, outcome, deadline)
            outcome.notes += self.setup_notes + self.warm_notes
        except Verdict as v:
            outcome.status, outcome.log, outcome.check = v.status, v.log, v.check
            if v.correctness is not None:
                outcome.correctness = v.correctness
            outcome.latency = None
            self.drop_worker()
        except WorkerTimeout as e:
            outcome.status = EvaluationStatus.TIMEOUT
            outcome.log = f"time limit of {self.cfg.timeout:.0f} s per workload exceeded: {e}"
            self.drop_worker()
        except WorkerCrashed as e:
            if "reference worker" in str(e):
                outcome.status, outcome.log = EvaluationStatus.INVALID_REFERENCE, str(e)
            else:
                outcome.status, outcome.log = EvaluationStatus.RUNTIME_ERROR, str(e)
            self.drop_worker()
        return outcome

    def _left(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WorkerTimeout("deadline passed")
        return left

    def _ref(self, msg: Request, expected: type[R], deadline: float) -> R:
        reply = self._ask(
            self.guard.reference(), msg, expected, self._left(deadline), "the reference worker"
        )
        if isinstance(reply, ErrorReply):
            if reply.error == "reference":
                raise Verdict(
                    "INVALID_REFERENCE",
                    f"{REFERENCE_FAILED}: {reply.message}\n{reply.traceback}",
                )
            raise Verdict("INVALID_REFERENCE", f"reference worker: {reply.message}")
        return reply

    def _judge_round(
        self,
        wl: Workload,
        seed: int,
        headers: list[dict[str, Any]],
        outcome: WorkloadOutcome,
        deadline: float,
        what: str,
        ran: CandidateRan | None = None,
    ) -> None:
        """``ran``: the candidate's run reply, whose input writes are checked against what
        the reference writes; None: not a run (a sampled timed call)."""
        objects = [h for h in headers if h.get("kind") == "object"]
        if objects:
            raise Verdict(
                "RUNTIME_ERROR",
                f"{what}: returned a {objects[0].get('type')} where a torch.Tensor was expected",
            )
        ref_ran = self._ref(RunRequest(workload=wl, seed=seed), ReferenceRan, deadline)
        self._add_parts("round.reference", ref_ran.phases_s, ("inputs", "call"))
        outcome.notes += [n for n in ref_ran.notes if n not in outcome.notes]
        if ran is not None:
            check_writes(ran.writes, ref_ran.writes, what)
        reply = self._ref(
            CompareRequest(workload=wl, seed=seed, outputs=headers, tolerance=wl.tolerance),
            Compared,
            deadline,
        )
        self._add_parts("round", reply.phases_s, ("compare",))
        if reply.exchange_failed is not None:
            if not self.settings.gpu_exchange:  # not asked for: the header is the candidate's
                raise hack("output-type", f"{what}: an unrequested CUDA IPC header is refused "
                           f"({reply.exchange_failed})")  # fmt: skip
            raise ExchangeFailed(reply.exchange_failed)
        for check in reply.checks:
            if check.status == "ok":
                outcome.correctness = merge_errors(outcome.correctness, check)
                continue
            if check.status == "type":
                raise hack("output-type", f"{what}: {check.message}")
            corr = merge_errors(outcome.correctness, check) if check.status == "numerical" else None
            raise Verdict(_CHECK_STATUS[check.status], f"{what}: {check.message}", corr)

    def cand(self, msg: Request, expected: type[R], deadline: float, what: str) -> R:
        """``msg`` answered by the candidate's worker (started and loaded when needed):
        its sentinel's findings, an error or a malformed reply raise the ``Verdict``."""
        w = self._ensure_worker()
        reply = self._ask(w, msg, expected, self._left(deadline), what)
        violations: list[ViolationReport] = getattr(reply, "violations", [])
        bad = from_violations(violations)
        if bad is not None:
            raise bad
        if isinstance(reply, ErrorReply):
            v = reply_verdict(reply)
            v.log = f"{what}: {v.log}"
            raise v
        self.precision = {**self.precision, **getattr(reply, "precision", {})}
        return reply

    def _round(
        self,
        wl: Workload,
        seed: int,
        outcome: WorkloadOutcome,
        deadline: float,
        what: str,
        reuse_timed: bool = False,
    ) -> None:
        """One correctness round: the candidate runs, the reference worker judges."""
        request = RunRequest(
            workload=wl,
            seed=seed,
            exchange_dir=str(self.guard.tmp),
            ipc=self.settings.gpu_exchange,
            copy_bytes=self.cfg.copy_bytes,
            reuse_timed=reuse_timed,
        )
        reply = self.cand(request, CandidateRan, deadline, what)
        self._add_parts("round.candidate", reply.phases_s, ROUND_PARTS)
        self._judge_round(wl, seed, reply.outputs, outcome, deadline, what, reply)

    def _judge(self, wl: Workload, outcome: WorkloadOutcome, deadline: float) -> None:
        cfg, uuid = self.cfg, wl.uuid
        t0 = time.monotonic()
        for r in range(cfg.rounds):
            self._round(wl, derive_seed(cfg.seed, uuid, r), outcome, deadline, f"round {r + 1}")
        self._tick("correctness", t0)
        t1 = time.monotonic()
        one = self.guard.one_timed_call(wl)  # the last timed call alone is judged
        seeds = [
            derive_seed(cfg.seed, uuid, POOL_ROUND_BASE + i)
            for i in range(cfg.warmup + cfg.iterations)
        ]
        request = cfg.time_request(
            wl,
            seeds,
            one_sample=one,
            exchange_dir=str(self.guard.tmp),
            ipc=self.settings.gpu_exchange,
            cupti=self.settings.cupti,
        )
        timed = self.cand(request, CandidateTimed, deadline, "timing")
        self._tick("timing", t1)
        self._add_parts("timing", timed.phases_s, ("inputs", "calls", "outputs"))
        t2 = time.monotonic()
        for sample in timed.sampled:
            try:
                self._judge_round(wl, sample.seed, sample.outputs, outcome, deadline, "timed call")
            except Verdict as v:
                if v.status in _KEEP:
                    raise
                raise hack("recheck", f"a timed call's output is wrong ({v.log})") from None
        seed = derive_seed(cfg.seed, uuid, RECHECK_ROUND)
        try:
            self._round(wl, seed, outcome, deadline, "re-check", reuse_timed=True)
        except Verdict as v:
            if v.status in _KEEP:
                raise
            raise hack("recheck", f"fresh inputs after timing fail ({v.log})") from None
        self._tick("recheck", t2)
        outcome.latency = {**timed.summary, "pool": timed.pool}
        if timed.torch_compile is not None:  # cumulative in this worker
            outcome.latency["torch_compile"] = timed.torch_compile
        self._precision_verdict(outcome)
        t3 = time.monotonic()
        if cfg.time_reference and one:
            # outputs that crowd the GPU: the re-check's, still exported, would sit beside
            # the reference's timing pool and its calls' outputs
            self.cand(ReleaseRequest(), Done, deadline, "release")
        if cfg.time_reference:
            outcome.reference = self.guard.reference_timing(
                wl, False, seeds, deadline, cfg, one_sample=one, notes=outcome.notes
            )
            if cfg.time_compiled_reference:
                try:
                    outcome.compiled_reference = self.guard.reference_timing(
                        wl, True, seeds, deadline, cfg
                    )
                except Verdict as v:  # the baseline failed, not the candidate
                    outcome.notes.append(f"no torch.compile baseline: {v.log[:500]}")
        self._tick("reference_timing", t3)

    def _precision_verdict(self, outcome: WorkloadOutcome) -> None:
        flags = dict(self.precision)
        level = None
        rel = (outcome.correctness or {}).get("rel_l2_error")
        dtypes = {s.dtype.value for s in self.guard.problem.definition.outputs.values()}
        if rel is not None and dtypes == {"float32"}:
            import torch

            # compare.py imports torch at its top; the parent needs it only here
            from kernelarc.guard.compare import precision_level

            level = precision_level(float(rel), torch.float32)
        if level:
            flags["observed_error_level"] = level
        outcome.precision = flags
        lowered = {k: v for k, v in flags.items() if lowers_precision(k, v)}
        if lowered and self.cfg.strict_precision:
            raise hack("precision", f"reduced precision with --strict-precision: {lowered}")

    def drop_worker(self) -> None:
        """Kill the session's worker (the next request starts a new one)."""
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def close(self) -> None:
        """Close the worker; the guard then starts its warm spare for the next candidate
        (not before: the spare's start-up would share the cores with this one's timing)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.guard.prepare_spare()
