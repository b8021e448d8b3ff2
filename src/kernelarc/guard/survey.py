"""Where a machine stands: does each problem's reference run here, and if not, why.

:func:`survey` loads every problem below a root (``problem.discover``), picks workloads
(``all``, ``smallest``, or ``sample`` = smallest, median and largest by input bytes), and
runs the reference of each in the guard's own isolated reference worker
(``guard/worker.py``, ``guard/isolation.py``): a fresh process per problem (the next one is
started while the current one runs), a hard time limit per workload (run + one timed call),
the process killed on expiry. A crash, a hang or an out-of-memory kill ends that workload
only; the sweep goes on. Before running, inputs+outputs are estimated
(``estimate_input_bytes``): a workload whose estimate (x3 for the reference's temporaries on
the CPU, x1 on a GPU: see :data:`MEMORY_FACTOR`) exceeds the free memory is skipped
("skipped: needs N GB"), and on the CPU the worker runs
under an ``RLIMIT_DATA`` of 90% of the free memory, so an allocation fails in the worker
instead of the machine swapping or the OOM killer choosing a victim. Roofline bounds come
from ``roofline.bounds`` for the device's own profile, counted in a helper process with the
same time limit (``survey_bounds.py``: counting runs the reference too).

Failure reasons are classified (:func:`classify`): out of memory, unsupported op, missing
blob, timeout, load error, skipped, other; the first error line is kept.

Not covered: judging solutions (``Guard``), accurate reference timing (one timed call,
no warm-up: an indication, not a measurement), memory use of references beyond the x3
estimate, GPU memory held by other processes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from kernelarc.env import cache_dir
from kernelarc.guard.footprint import device_bytes
from kernelarc.guard.isolation import (
    Isolation,
    WorkerCrashed,
    WorkerProcess,
    WorkerTimeout,
    probe_isolation,
    scrubbed_environment,
)
from kernelarc.guard.messages import (
    ErrorReply,
    MalformedReply,
    ReferenceRan,
    ReferenceReady,
    ReferenceSetup,
    ReferenceTimed,
    Reply,
    Request,
    RunRequest,
    TimeRequest,
    decode,
)
from kernelarc.guard.scratch import make_scratch, sweep_stale
from kernelarc.guard.survey_bounds import BoundsHelper
from kernelarc.problem.discover import summarize
from kernelarc.problem.inputs import estimate_input_bytes, estimate_output_bytes
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Definition, Workload

R = TypeVar("R", bound=Reply)

Category = Literal[
    "out_of_memory", "unsupported_op", "missing_blob", "timeout", "load_error", "skipped", "other"
]
CATEGORY_LABELS: dict[str, str] = {
    "out_of_memory": "out of memory",
    "unsupported_op": "unsupported op",
    "missing_blob": "missing blob",
    "timeout": "timeout",
    "load_error": "load error",
    "skipped": "skipped (memory)",
    "other": "other",
}
MEMORY_FACTOR = {"cpu": 3, "cuda": 1}
"""Estimated peak = factor x (input + output bytes) per device type. On the CPU x3 (references
upcast and copy), so that a workload that would make the machine swap is not started. On a
GPU only what cannot fit at all is skipped: running out of device memory is an ordinary,
reported error there (category ``out_of_memory``), and the x3 estimate skipped references
that do run."""
SEED = 200


class WorkloadCheck(BaseModel):
    uuid: str
    axes: dict[str, int]
    status: Literal["ok", "failed", "skipped"]
    reason: str | None = None
    category: Category | None = None
    input_bytes: int | None = None
    reference_ms: float | None = None
    """One timed call (no warm-up) after a first untimed run."""
    bound_ms: float | None = None
    notes: list[str] = Field(default_factory=list)


class ProblemCheck(BaseModel):
    name: str
    subset: str | None
    path: str
    status: Literal["ok", "failed"]
    reason: str | None = None
    category: Category | None = None
    workloads: list[WorkloadCheck] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    wall_s: float = 0.0


class SurveyOptions(BaseModel):
    device: str = "cpu"
    workloads: Literal["all", "smallest", "sample"] = "smallest"
    timeout: float = Field(default=300.0, gt=0, description="seconds per workload")
    setup_timeout: float = Field(default=120.0, gt=0)
    subset: str | None = None
    cache_dir: Path | None = None


# ---------------------------------------------------------------- classification

_OOM = ("out of memory", "outofmemoryerror", "memoryerror", "can't allocate memory",
        "cannot allocate memory", "not enough memory", "std::bad_alloc")  # fmt: skip
_UNSUPPORTED = ("cublas_status_not_supported", "notimplementederror", "not supported",
                "not implemented for", "unsupported", "no kernel image is available",
                "requires compute capability", "not compiled with cuda enabled",
                "found no nvidia driver", "no cuda gpus are available")  # fmt: skip


def first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return "(no message)"


def classify(message: str, detail: str = "") -> Category:
    """The category of a failure from its message (and traceback or log)."""
    low = f"{message}\n{detail}".lower()
    if "missingbloberror" in low or ("safetensors file" in low and "absent" in low):
        return "missing_blob"
    if any(k in low for k in _OOM):
        return "out_of_memory"
    if any(k in low for k in _UNSUPPORTED):
        return "unsupported_op"
    return "other"


def select_workloads(definition: Definition, workloads: list[Workload], how: str) -> list[Any]:
    """The workloads to run, each with its input bytes (None when its axes do not resolve)."""
    sized: list[tuple[Workload, int | None]] = []
    for wl in workloads:
        try:
            sized.append((wl, estimate_input_bytes(definition, wl)))
        except Exception:  # reported when the workload is run
            sized.append((wl, None))
    if how == "all" or not sized:
        return sized
    order = sorted(sized, key=lambda x: (x[1] is None, x[1] or 0))
    if how == "smallest":
        return order[:1]
    picks = [order[0], order[len(order) // 2], order[-1]]
    unique: dict[str, tuple[Workload, int | None]] = {}
    for p in picks:
        unique.setdefault(p[0].uuid, p)
    return list(unique.values())


def available_bytes(device: str) -> int:
    """Free host memory (MemAvailable) for the CPU; total memory of the GPU for CUDA."""
    total = device_bytes(device)
    if total is not None:
        return total
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable line in /proc/meminfo")


# ---------------------------------------------------------------- running


class _Workers:
    """Fresh reference workers, one started ahead."""

    def __init__(self, opts: SurveyOptions, tmp: Path) -> None:
        self.opts, self.tmp, self.count = opts, tmp, 0
        self.base: Isolation = probe_isolation(True)
        cache = (opts.cache_dir or cache_dir()).resolve()
        extra = {
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TMPDIR": str(tmp / "scratch"),
        }
        if opts.device == "cpu":
            extra["TRITON_INTERPRET"] = "1"
        (tmp / "scratch").mkdir(parents=True, exist_ok=True)
        self.env = scrubbed_environment(extra)
        self.spare: WorkerProcess | None = None
        self.bounds = BoundsHelper(self.env)

    def _start(self) -> WorkerProcess:
        self.count += 1
        iso = self.base
        if self.opts.device == "cpu":  # allocations fail in the worker, not the machine
            limit = int(0.9 * available_bytes("cpu"))
            if shutil.which("prlimit"):
                iso = Isolation((*iso.prefix, "prlimit", f"--data={limit}"), iso.description)
        return WorkerProcess(
            "reference",
            isolation=iso,
            env=self.env,
            log_path=self.tmp / f"reference-{self.count}.log",
            cwd=self.tmp / f"reference-{self.count}",
        ).start()

    def take(self, prestart: bool) -> WorkerProcess:
        w, self.spare = self.spare, None
        if w is None or not w.alive():
            w = self._start()
        if prestart:
            self.spare = self._start()
        return w

    def close(self) -> None:
        self.bounds.close()
        if self.spare is not None:
            self.spare.kill()
            self.spare = None


def _ask(w: WorkerProcess, msg: Request, expected: type[R], timeout: float) -> R | ErrorReply:
    """``msg`` answered by the reference worker; a malformed reply reads as a failure."""
    try:
        return decode(w.request(msg, timeout=timeout), expected)
    except MalformedReply as e:
        return ErrorReply(error="check-error", message=str(e))


def _setup(w: WorkerProcess, problem: Problem, opts: SurveyOptions) -> ReferenceReady | ErrorReply:
    setup = ReferenceSetup(
        device=opts.device,
        definition=problem.definition,
        problem_root=str(problem.root),
        cache_bytes=0,
    )
    return _ask(w, setup, ReferenceReady, opts.setup_timeout)


def _fail(check: WorkloadCheck, category: Category, reason: str) -> WorkloadCheck:
    check.status = "skipped" if category == "skipped" else "failed"
    check.category, check.reason = category, reason
    return check


def _run_one(w: WorkerProcess, wl: Workload, check: WorkloadCheck, opts: SurveyOptions) -> None:
    """Run then time the reference once on ``wl``; raises WorkerTimeout / WorkerCrashed."""
    deadline = time.monotonic() + opts.timeout
    reply = _ask(w, RunRequest(workload=wl, seed=SEED), ReferenceRan, opts.timeout)
    if isinstance(reply, ErrorReply):
        _fail(check, classify(reply.message, reply.traceback), first_line(reply.message))
        return
    check.notes = list(reply.notes)
    check.status = "ok"  # it ran; the timed call below only adds reference_ms
    left = deadline - time.monotonic()
    if left <= 1:
        check.notes.append("not timed: the time limit was spent by the first run")
        return
    req = TimeRequest(workload=wl, seeds=[SEED], warmup=0, iterations=1)
    try:
        timed = _ask(w, req, ReferenceTimed, left)
    except WorkerTimeout:  # the worker is killed; the caller starts a fresh one
        check.notes.append(f"not timed: the timed call exceeded the time limit ({left:.0f} s)")
        raise _TimingTimeout() from None
    if isinstance(timed, ErrorReply):
        _fail(check, classify(timed.message, timed.traceback), first_line(timed.message))
        return
    check.reference_ms = float(timed.summary["median_ms"])


class _TimingTimeout(Exception):
    """The run passed but the timed call ran out of time (the worker was killed)."""


def check_problem(
    problem: Problem, workers: _Workers, opts: SurveyOptions, *, prestart: bool = False
) -> ProblemCheck:
    """Run the reference of one loaded problem on the chosen workloads."""
    t0 = time.monotonic()
    d = problem.definition
    out = ProblemCheck(
        name=d.name, subset=problem.subset, path=str(problem.root), status="ok",
        notes=list(problem.notes),
    )  # fmt: skip
    chosen = select_workloads(d, list(problem.workloads), opts.workloads)
    uuids = [wl.uuid for wl, _ in chosen]
    bounds, warnings = workers.bounds.bounds(problem.root, uuids, opts.device, opts.timeout)
    out.notes += warnings
    checks = [
        WorkloadCheck(
            uuid=wl.uuid,
            axes=dict(wl.axes),
            status="failed",
            input_bytes=nbytes,
            bound_ms=bounds.get(wl.uuid),
        )  # fmt: skip
        for wl, nbytes in chosen
    ]
    out.workloads = checks
    todo: list[tuple[Workload, WorkloadCheck]] = []
    free = available_bytes(opts.device)
    for (wl, nbytes), check in zip(chosen, checks, strict=True):
        if nbytes is None:
            _fail(check, "load_error", "its axes do not resolve")
            continue
        factor = MEMORY_FACTOR["cuda" if opts.device.startswith("cuda") else "cpu"]
        need = factor * (nbytes + estimate_output_bytes(d, wl))
        if need > free:
            _fail(check, "skipped", f"skipped: needs {need / 1e9:.1f} GB "
                  f"({factor}x inputs+outputs), {free / 1e9:.1f} GB available")  # fmt: skip
            continue
        todo.append((wl, check))
    worker: WorkerProcess | None = None
    try:
        for wl, check in todo:
            try:
                if worker is None or not worker.alive():
                    worker = workers.take(prestart)
                    reply = _setup(worker, problem, opts)
                    if isinstance(reply, ErrorReply):
                        text = reply.message
                        for _, c in todo:
                            if c.status == "failed" and c.reason is None:  # not run yet
                                _fail(c, "load_error", first_line(f"reference: {text}"))
                        break
                _run_one(worker, wl, check, opts)
            except _TimingTimeout:
                worker = None
            except WorkerTimeout as e:
                _fail(check, "timeout", f"time limit of {opts.timeout:.0f} s exceeded ({e})")
                if worker is not None:
                    worker.kill()
                worker = None
            except WorkerCrashed as e:
                text = str(e)
                cat = classify(text)
                if "SIGKILL" in text and cat == "other":
                    cat, text = "out_of_memory", f"{first_line(text)} (likely out of memory)"
                _fail(check, cat, first_line(text))
                worker = None
    finally:
        if worker is not None:
            worker.close()
    bad = [c for c in checks if c.status != "ok"]
    if bad:
        out.status, out.category = "failed", bad[0].category
        out.reason = bad[0].reason if len(bad) == 1 else f"{bad[0].reason} (+{len(bad) - 1} more)"
    out.wall_s = round(time.monotonic() - t0, 3)
    return out


def survey(
    dirs: list[Path],
    opts: SurveyOptions,
    progress: Callable[[int, int, ProblemCheck], None] | None = None,
) -> list[ProblemCheck]:
    """Check every problem directory in ``dirs`` (load errors become failed entries)."""
    loaded: list[Problem | ProblemCheck] = []
    for d in dirs:
        try:
            problem = load_problem(d)
        except Exception:
            s = summarize(d)  # never raises; gives name, subset and the load error
            err = s.error or "does not load"
            loaded.append(ProblemCheck(name=s.name, subset=s.subset, path=str(d),
                                       status="failed", category="load_error",
                                       reason=first_line(err)))  # fmt: skip
            continue
        loaded.append(problem)
    if opts.subset is not None:
        want = opts.subset.lower()
        loaded = [p for p in loaded if (p.subset or "").lower() == want]
    sweep_stale("kernelarc-survey-")  # folders of surveys that were killed (scratch.py)
    tmp = make_scratch("kernelarc-survey-")
    workers = _Workers(opts, tmp)
    results: list[ProblemCheck] = []
    try:
        for i, item in enumerate(loaded):
            more = any(isinstance(x, Problem) for x in loaded[i + 1 :])
            res = item if isinstance(item, ProblemCheck) else check_problem(
                item, workers, opts, prestart=more
            )  # fmt: skip
            results.append(res)
            if progress is not None:
                progress(i + 1, len(loaded), res)
    finally:
        workers.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def summary_by_subset(results: list[ProblemCheck]) -> dict[str, dict[str, int]]:
    """subset -> {"problems", "ok", "failed", <category>: count}."""
    out: dict[str, dict[str, int]] = {}
    for r in results:
        row = out.setdefault(r.subset or "-", {"problems": 0, "ok": 0, "failed": 0})
        row["problems"] += 1
        row[r.status] += 1
        if r.category is not None:
            row[r.category] = row.get(r.category, 0) + 1
    return out


__all__ = [
    "CATEGORY_LABELS",
    "ProblemCheck",
    "SurveyOptions",
    "WorkloadCheck",
    "classify",
    "summary_by_subset",
    "survey",
]
