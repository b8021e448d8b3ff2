"""The gemm-tables agent's tuning subprocess: run a base solution under PyTorch TunableOp with
tuning on, once per workload shape, and write the resulting cuBLAS/cuBLASLt table.

Both sides live here. Parent: :func:`run_tuning` starts ``python -m
kernelarc.proposers.tunableop_worker JOB.json`` (a :class:`TuningJob`) with a time limit,
kills its whole process tree when it runs over, and returns a :class:`TuningRun` (exit
status, events, stderr tail, the table). Child: :func:`main`. Protocol: one JSON object
per stdout line (event ``device`` once CUDA is up, ``workload`` per workload, ``done`` at
the end); diagnostics and tracebacks go to stderr. Exit codes: 0 done (some workloads may
have failed, listed in ``done``), 2 the job or the base solution does not load, 3 no CUDA
device or no TunableOp in this torch build, 4 every workload failed.

Settings go through the ``torch.cuda.tunable`` Python API, never environment variables (the
parent removes ``PYTORCH_TUNABLEOP_*`` from this process's environment, so the API is
authoritative). TunableOp appends each new result to its results file as it is found
(``job.live_path``: a partial table survives a timeout); at the end the complete table is
written from ``get_validators()``/``get_results()`` to ``job.table_path``.

Also here: :func:`parse_table`, the parser and checker of that CSV format (the parent reads
the table it ships with it). Format, per TunableOp's documentation and source: ``Validator,
KEY,VALUE`` lines (``PT_VERSION`` always; ROCm builds add library versions), then one line
per tuned operation: ``OP_SIGNATURE,PARAMS_SIGNATURE,SOLUTION[,TIME_MS[,...]]``, e.g.
``GemmTunableOp_float_NT,nt_64_17_128_ld_128_128_64,Gemm_Cublaslt_..., 0.004`` (the op
names the dtype and transposes, the params the shape; ``Default`` is the untuned cuBLAS call).

The child's memory is capped at ``job.memory_fraction`` of the device
(:data:`TUNING_MEMORY_SHARE` by default): a workload that needs more fails to tune (listed in
``done``) rather than taking the memory the guard's workers judge with.

Not covered: choosing what to tune (every GEMM the base runs on every workload is tuned),
multi-GPU tuning, offline tuning from recorded untuned files.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kernelarc.guard.build import choose_builder, load_entry
from kernelarc.guard.build_base import kill_process_tree
from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.inputs import generate_inputs, torch_dtype
from kernelarc.problem.schema import Definition, Solution, Workload

#: The share of the device's memory the tuning subprocess may hold (PyTorch's caching
#: allocator is capped there: an allocation beyond it fails in the tuning, which goes on
#: with the next workload). The guard's reference and candidate workers judge on the same
#: device meanwhile and keep the rest: an uncapped tuning of a problem with large
#: temporaries can take the memory a judged candidate needs, which then fails.
TUNING_MEMORY_SHARE = 0.25

EXIT_BAD_JOB = 2
EXIT_NO_TUNABLEOP = 3
EXIT_ALL_FAILED = 4
STDERR_TAIL = 4000


class TuningJob(BaseModel):
    """Everything the tuning subprocess needs; written as JSON by the parent."""

    model_config = ConfigDict(extra="forbid")

    definition: Definition
    workloads: list[Workload] = Field(min_length=1)
    solution: Solution
    device: str = "cuda"
    seed: int = 0
    problem_root: str | None = None
    build_dir: str
    table_path: str
    live_path: str
    memory_fraction: float = Field(default=TUNING_MEMORY_SHARE, gt=0, le=1)
    max_tuning_ms: int = Field(default=30, ge=1)
    max_tuning_iterations: int = Field(default=100, ge=1)
    build_timeout_s: float = Field(default=120.0, gt=0)


class TableError(ValueError):
    """A TunableOp results file that cannot be shipped; the message says which line."""


class TableEntry(BaseModel):
    """One tuned operation: which op, for which parameters (shape), which solution won."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str = Field(min_length=1)
    params: str = Field(min_length=1)
    solution: str = Field(min_length=1)
    time_ms: float | None = None
    extra: tuple[str, ...] = ()


class TunableTable(BaseModel):
    """A parsed TunableOp results file: validators and entries, in a canonical order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    validators: dict[str, str]
    entries: tuple[TableEntry, ...]

    @property
    def torch_version(self) -> str:
        return self.validators["PT_VERSION"]

    def gemm_entries(self) -> tuple[TableEntry, ...]:
        """Entries of GEMM-family ops (plain, batched, with bias, scaled)."""
        return tuple(e for e in self.entries if "Gemm" in e.op)

    def tuned(self) -> tuple[TableEntry, ...]:
        """GEMM entries where tuning chose something other than the default cuBLAS call."""
        return tuple(e for e in self.gemm_entries() if e.solution != "Default")

    def to_csv(self) -> str:
        """The table in TunableOp's format: validators by key, then entries by (op, params)."""
        lines = [f"Validator,{k},{v}" for k, v in sorted(self.validators.items())]
        for e in sorted(self.entries, key=lambda e: (e.op, e.params)):
            fields = [e.op, e.params, e.solution]
            if e.time_ms is not None or e.extra:
                fields.append("" if e.time_ms is None else f"{e.time_ms:.6f}")
            lines.append(",".join([*fields, *e.extra]))
        return "\n".join(lines) + "\n"


def parse_table(text: str, *, where: str = "table") -> TunableTable:
    """Parse and check a TunableOp CSV. Refused (:class:`TableError`): a line with fewer
    than 3 fields, a validator given twice with different values, a missing ``PT_VERSION``
    validator, an operation listed twice with different solutions, a non-numeric time."""
    validators: dict[str, str] = {}
    entries: dict[tuple[str, str], TableEntry] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not all(parts[:3]):
            raise TableError(f"{where}:{n}: expected at least 3 non-empty fields: {line[:120]!r}")
        if parts[0] == "Validator":
            key, value = parts[1], ",".join(parts[2:])
            if validators.get(key, value) != value:
                raise TableError(f"{where}:{n}: validator {key} given twice ({value!r})")
            validators[key] = value
            continue
        time_ms: float | None = None
        if len(parts) > 3 and parts[3]:
            try:
                time_ms = float(parts[3])
            except ValueError:
                raise TableError(f"{where}:{n}: time {parts[3]!r} is not a number") from None
        entry = TableEntry(
            op=parts[0], params=parts[1], solution=parts[2], time_ms=time_ms, extra=tuple(parts[4:])
        )
        old = entries.get((entry.op, entry.params))
        if old is not None and old.solution != entry.solution:
            raise TableError(
                f"{where}:{n}: {entry.op}({entry.params}) listed twice with different solutions"
            )
        entries.setdefault((entry.op, entry.params), entry)
    if "PT_VERSION" not in validators:
        raise TableError(f"{where}: no 'Validator,PT_VERSION,...' line (TunableOp requires it)")
    ordered = tuple(entries[k] for k in sorted(entries))
    return TunableTable(validators=validators, entries=ordered)


def tunableop_missing() -> str | None:
    """Why TunableOp cannot tune here (no CUDA device, or a torch build without it), else
    None. Imports torch."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is available (torch.cuda.is_available() is False)"
    if not hasattr(torch._C, "_cuda_tunableop_enable"):
        return f"torch {torch.__version__} was built without TunableOp (torch.cuda.tunable)"
    return None


# ------------------------------------------------------------------------------ parent side


@dataclass(frozen=True)
class TuningRun:
    """What one tuning subprocess left: exit status, events, stderr tail, and the table
    (the complete one, or TunableOp's live file when the run did not finish)."""

    pid: int
    returncode: int | None
    timed_out: bool
    seconds: float
    events: tuple[dict[str, Any], ...]
    stderr: str
    table_text: str | None
    partial: bool

    def event(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e.get("event") == kind), None)

    def failure(self) -> str | None:
        """Why the run did not complete (None when it did), with the last stderr line."""
        if self.timed_out:
            why = f"the tuning subprocess ran past its {self.seconds:.0f} s limit and was killed"
        elif self.returncode != 0:
            why = f"the tuning subprocess exited with code {self.returncode}"
        else:
            return None
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        return f"{why} (stderr: {lines[-1][:200]})" if lines else f"{why} (no stderr)"


def _child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_TUNABLEOP_")}


def run_tuning(job: TuningJob, work_dir: Path, timeout_s: float) -> TuningRun:
    """Run the tuning subprocess on ``job`` (its paths should lie in ``work_dir``), killing
    its whole process tree after ``timeout_s``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    job_path = work_dir / "job.json"
    job_path.write_text(job.model_dump_json(), encoding="utf-8")
    cmd = [sys.executable, "-m", "kernelarc.proposers.tunableop_worker", str(job_path)]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
        cwd=work_dir,
        start_new_session=True,
    )
    timed_out = False
    # The calling thread may be cut off at interpreter exit (the orchestrator's proposal
    # threads are daemons): the tuning, in a session of its own, must not outlive us.
    at_exit = functools.partial(kill_process_tree, proc.pid)
    atexit.register(at_exit)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_process_tree(proc.pid)
        out, err = proc.communicate()
    except BaseException:  # interrupted: the tuning ends with us
        kill_process_tree(proc.pid)
        raise
    finally:
        atexit.unregister(at_exit)
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a library printed something JSON-like; the protocol lines parse
    final, live = Path(job.table_path), Path(job.live_path)
    done = not timed_out and proc.returncode == 0 and final.is_file()
    source = final if done else live if live.is_file() else None
    return TuningRun(
        pid=proc.pid,
        returncode=proc.returncode,
        timed_out=timed_out,
        seconds=timeout_s if timed_out else time.monotonic() - t0,
        events=tuple(events),
        stderr=err[-STDERR_TAIL:],
        table_text=source.read_text(encoding="utf-8") if source is not None else None,
        partial=source is not None and not done,
    )


# ------------------------------------------------------------------------------ child side


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _outputs(definition: Definition, workload: Workload, device: str) -> list[Any]:
    import torch

    env = resolve_axes(definition, workload)
    return [
        torch.empty(
            resolve_shape(spec.shape, env) or (), dtype=torch_dtype(spec.dtype), device=device
        )
        for spec in definition.outputs.values()
    ]


def _configure(job: TuningJob) -> None:
    import torch.cuda.tunable as tunable

    tunable.record_untuned_enable(False)
    tunable.tuning_enable(True)
    tunable.set_filename(job.live_path, False)
    tunable.set_max_tuning_duration(job.max_tuning_ms)
    tunable.set_max_tuning_iterations(job.max_tuning_iterations)
    tunable.enable(True)


def _write_table(path: Path) -> TunableTable:
    """The complete table (validators, then every result) from TunableOp's own state,
    written in its CSV format and checked by :func:`parse_table`."""
    import torch.cuda.tunable as tunable

    raw_validators: Any = tunable.get_validators()  # pairs (torch's stub says one pair)
    raw_results: Any = tunable.get_results()  # (op, params, solution, time_ms) tuples
    validators = {str(v[0]): str(v[1]) for v in raw_validators}
    entries = tuple(
        TableEntry(op=str(r[0]), params=str(r[1]), solution=str(r[2]), time_ms=float(r[3]))
        for r in raw_results
    )
    text = TunableTable(validators=validators, entries=entries).to_csv()
    table = parse_table(text, where=str(path))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return table


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m kernelarc.proposers.tunableop_worker JOB.json", file=sys.stderr)
        return EXIT_BAD_JOB
    try:
        job = TuningJob.model_validate_json(Path(argv[0]).read_text(encoding="utf-8"))
        build_dir = Path(job.build_dir)
        artifact = choose_builder(job.solution).build(
            job.solution,
            work_dir=build_dir / "work",
            cache_dir=build_dir / "cache",
            timeout=job.build_timeout_s,
        )
        entry = load_entry(artifact)
    except Exception as e:
        log = getattr(e, "log", "") or traceback.format_exc()
        print(f"the tuning job or its base solution does not load: {e}\n{log}", file=sys.stderr)
        return EXIT_BAD_JOB
    missing = tunableop_missing()
    if missing is not None:
        print(f"cannot tune: {missing}", file=sys.stderr)
        return EXIT_NO_TUNABLEOP

    import torch

    device = torch.device(job.device)
    if device.index is None:  # the cap below needs an index ("cuda" alone raises there)
        device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    # before any allocation: the cap holds for everything this process allocates
    torch.cuda.set_per_process_memory_fraction(job.memory_fraction, device)
    _emit(
        "device",
        name=props.name,
        capability=f"{props.major}.{props.minor}",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        memory_cap_bytes=int(job.memory_fraction * props.total_memory),
    )
    _configure(job)
    root = Path(job.problem_root) if job.problem_root else None
    errors: list[str] = []

    def tune(wl: Workload) -> None:  # its tensors are freed when it returns or raises
        gen = generate_inputs(
            job.definition, wl, device=job.device, seed=job.seed, problem_root=root
        )
        args = list(gen.values.values())
        if job.solution.spec.destination_passing_style:
            args += _outputs(job.definition, wl, job.device)
        with torch.no_grad():
            entry(*args)
        torch.cuda.synchronize()

    for wl in job.workloads:
        t0 = time.monotonic()
        ok = True
        try:
            tune(wl)
        except Exception as e:
            msg = f"workload {wl.uuid}: {type(e).__name__}: {e}"
            errors.append(msg[:500])
            print(msg, file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            ok = False
        if not ok:  # e.g. over the memory cap: the next workloads get the memory back
            torch.cuda.empty_cache()
        _emit("workload", uuid=wl.uuid, ok=ok, seconds=round(time.monotonic() - t0, 3))
    import torch.cuda.tunable as tunable

    tunable.tuning_enable(False)
    table = _write_table(Path(job.table_path))
    _emit("done", results=len(table.entries), validators=len(table.validators), errors=errors)
    return EXIT_ALL_FAILED if len(errors) == len(job.workloads) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
