"""The built-in "gemm-tables" agent: per-shape cuBLAS/cuBLASLt algorithm tables found by
PyTorch TunableOp, shipped as a static table inside the solution.

How it works. ``propose`` picks a base (the reference first, then the best pytorch-language
incumbent of another agent on the board) and runs it, in a subprocess with a time limit
(:func:`run_tuning`, the script is :mod:`kernelarc.proposers.tunableop_worker`), on every
workload's inputs with ``torch.cuda.tunable`` enabled and tuning on. The proposed solution
is the base's sources, plus the resulting CSV table (``kernelarc_tunableop.csv``), plus a
wrapper entry (``kernelarc_gemm_tables.py``) that at import enables TunableOp with tuning
OFF, points it at the table beside itself (``pathlib.Path(__file__).parent``; the guard's
sentinel allows reading the candidate's own directory, and TunableOp reads it from C++),
and calls the base entry. It also reads the table in Python at import (to count its
entries), so a missing table fails the import on any device. No environment variable is
changed, and none is read for configuration.

What the wrapper guarantees: tuning is switched off before TunableOp is switched on, so
the candidate never benchmarks during the guard's timing; untuned-GEMM recording is off
and (torch versions that have it) ``write_file_on_exit(False)``. With tuning off TunableOp
never writes its results file (its realtime append happens only when a tuning result is
added, and the destructor only closes that file). The wrapper loads nothing, and leaves
TunableOp off (the base runs unchanged), when: there is no CUDA device or no TunableOp in
the torch build (the CPU path; :data:`TABLE_STATUS` in the generated module says why), any
``PYTORCH_TUNABLEOP_*`` variable is set (those override the API), the torch version or the
GPU (name and compute capability) differ from the ones the table was tuned on, or
``read_file`` refuses the table; with a CUDA device present it also warns. On that last
point, from TunableOp's source (2.13/main): a file whose validators (``PT_VERSION``; on
ROCm also the HIP/rocBLAS/hipBLASLt versions and GPU arch) do not match is *rejected* as a
whole (a warning, nothing loaded: every GEMM uses the default); CUDA builds validate only
the torch version, so a table from another NVIDIA GPU would be *accepted* and each entry
used wherever cuBLASLt accepts the algorithm for that problem (else the default). That is
why the wrapper checks the GPU itself and ignores the table on another GPU.

When ``propose`` returns None: the device is not CUDA, this torch has no TunableOp (the CPU
CI case), every base was tried, the base ran without any GEMM reaching TunableOp, or the
largest workload's inputs would not fit beside the guard's (:func:`fits_beside_guard`; the
reason is kept in :attr:`GemmTablesAgent.skipped` and logged), or the run's search has
under ``MIN_TUNING_S`` left (``AgentContext.time_left_s``, which also caps the tuning's
``timeout_s``: a tuning still running when the search ends is judged by no one). When
tuning fails with nothing tuned (timeout, crash, the base does not load) ``propose`` raises
:class:`TuningFailed` with the subprocess's stderr (the orchestrator records it and shows
it as feedback); a timeout after some GEMMs were tuned ships the partial table and says so
in the conclusion. The conclusion states how many GEMM shapes were tuned, how many chose a
non-default algorithm, and the guard's verdict.

Not covered: inputs beyond what the context gives unless the agent is built with the
:class:`~kernelarc.problem.loader.Problem` (then the real workloads are used; without it,
inputs are random tensors of each workload's axes, scalar inputs included); isolating the
tuning run from the guard's timing on a shared GPU; Triton/C++ bases; GEMMs that do not go
through ``at::cuda::blas`` (Triton templates of max-autotune, cuDNN).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from kernelarc.agents.base import AgentStateError
from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.problem.inputs import estimate_input_bytes
from kernelarc.problem.loader import Problem
from kernelarc.problem.reference import reference_solution
from kernelarc.problem.schema import Definition, Solution, Workload
from kernelarc.proposers.base import BuiltinAgent
from kernelarc.proposers.common import (
    board_parent,
    clip,
    count_of,
    failure_summary,
    score_text,
)
from kernelarc.proposers.tunableop_worker import (
    TableError,
    TunableTable,
    TuningJob,
    TuningRun,
    parse_table,
    run_tuning,
    tunableop_missing,
)

TABLE_FILE = "kernelarc_tunableop.csv"
WRAPPER_FILE = "kernelarc_gemm_tables.py"
WRAPPER_ENTRY = "kernelarc_entry"
DEFAULT_TIMEOUT_S = 300.0
#: The least tuning time worth starting a tuning for (seconds).
MIN_TUNING_S = 15.0
log = logging.getLogger(__name__)


class TuningFailed(RuntimeError):
    """The tuning subprocess produced no table to ship (the message carries its stderr)."""


class TunedOn(BaseModel):
    """Where a table was tuned; the wrapper loads it only on the same torch and GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    torch: str
    device: str
    capability: str


# ------------------------------------------------------------------------------ the solution


def wrapper_source(base: Solution, tuned_on: TunedOn, entries: int) -> str:
    """The wrapper entry module: enable TunableOp (tuning off) on the shipped table, then
    call the base entry. Importable and runnable on the CPU (TunableOp stays off)."""
    base_file, base_symbol = base.spec.entry_file, base.spec.entry_symbol
    module = "kernelarc_gemm_base_" + base.content_hash()[:12]
    return f'''"""KernelArc gemm-tables agent: the base solution with a static TunableOp table.

The table ({TABLE_FILE}, {entries} entries) was tuned with torch {tuned_on.torch} on
{tuned_on.device} (compute capability {tuned_on.capability}). TABLE_STATUS says whether it
is in use; otherwise the base runs unchanged.
"""

import importlib.util
import os
import pathlib
import sys
import warnings

import torch

_HERE = pathlib.Path(__file__).parent
_TABLE = _HERE / {TABLE_FILE!r}
_TUNED_ON = {tuned_on.model_dump()!r}


def _load_base():
    spec = importlib.util.spec_from_file_location({module!r}, _HERE / {base_file!r})
    if spec is None or spec.loader is None:
        raise ImportError("cannot load the base entry file " + {base_file!r})
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, {base_symbol!r})


def _count_entries():
    lines = _TABLE.read_text(encoding="utf-8").splitlines()
    return sum(1 for line in lines if line.strip() and not line.startswith("Validator,"))


_ENTRIES = _count_entries()


def _why_off():
    if _ENTRIES == 0:
        return "the table has no entries"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not hasattr(torch._C, "_cuda_tunableop_enable"):
        return "this torch build has no TunableOp"
    preset = sorted(k for k in os.environ if k.startswith("PYTORCH_TUNABLEOP_"))
    if preset:
        return "the environment sets " + ", ".join(preset) + ", which override the API"
    if torch.__version__ != _TUNED_ON["torch"]:
        return "tuned with torch " + _TUNED_ON["torch"] + ", this is " + torch.__version__
    name = torch.cuda.get_device_name()
    cap = "%d.%d" % torch.cuda.get_device_capability()
    if (name, cap) != (_TUNED_ON["device"], _TUNED_ON["capability"]):
        tuned = _TUNED_ON["device"] + " (" + _TUNED_ON["capability"] + ")"
        return "tuned on " + tuned + ", this is " + name + " (" + cap + ")"
    return None


def _activate():
    why = _why_off()
    if why is not None:
        if torch.cuda.is_available() and _ENTRIES:
            warnings.warn("gemm-tables: table not used: " + why, stacklevel=2)
        return "off: " + why
    tunable = torch.cuda.tunable
    tunable.tuning_enable(False)
    tunable.record_untuned_enable(False)
    if hasattr(tunable, "write_file_on_exit"):
        tunable.write_file_on_exit(False)
    tunable.set_filename(str(_TABLE), False)
    tunable.enable(True)
    if tunable.read_file(str(_TABLE)) is False:
        tunable.enable(False)
        why = "TunableOp refused the table (its validators do not match this build)"
        warnings.warn("gemm-tables: " + why + "; running the base without it", stacklevel=2)
        return "off: " + why
    return "on: %d entries from %s" % (_ENTRIES, _TABLE.name)


TABLE_STATUS = _activate()
_base_entry = _load_base()


def {WRAPPER_ENTRY}(*args, **kwargs):
    return _base_entry(*args, **kwargs)
'''


def table_solution(
    base: Solution, table: TunableTable, tuned_on: TunedOn, *, agent: str, name: str
) -> Solution:
    """``base`` plus the table and the wrapper entry (same languages and calling style)."""
    taken = {s.path for s in base.sources} & {TABLE_FILE, WRAPPER_FILE}
    if taken:
        raise ValueError(f"base solution {base.name!r} already has {sorted(taken)}")
    data = base.model_dump(mode="json")
    data.update(
        name=name,
        author=f"kernelarc:{agent}",
        description=f"{base.name} with a TunableOp table of {len(table.gemm_entries())} GEMM "
        f"shapes tuned on {tuned_on.device} (torch {tuned_on.torch}).",
    )
    data["spec"]["entry_point"] = f"{WRAPPER_FILE}::{WRAPPER_ENTRY}"
    data["sources"] = [
        *data["sources"],
        {"path": TABLE_FILE, "content": table.to_csv()},
        {"path": WRAPPER_FILE, "content": wrapper_source(base, tuned_on, len(table.entries))},
    ]
    return Solution.model_validate(data)


# ------------------------------------------------------------------------------ the agent


@dataclass(frozen=True)
class Base:
    """A solution to tune: its label, the candidate it came from and its latencies."""

    label: str
    solution: Solution
    parent_id: str | None
    baseline_ms: dict[str, float]


def _is_pytorch(sol: Solution) -> bool:
    names = {s.path for s in sol.sources}
    return [lang.value for lang in sol.spec.languages] == ["pytorch"] and not (
        names & {TABLE_FILE, WRAPPER_FILE}
    )


#: Input sets the device must hold while a tuning run goes on beside the guard: the
#: reference and candidate workers each hold a workload's inputs and outputs, and so does
#: the tuning subprocess (outputs counted as large as the inputs).
INPUT_SETS_ON_DEVICE = 6


def fits_beside_guard(
    definition: Definition, workloads: Sequence[Workload], total: int
) -> str | None:
    """None when the tuning run fits on a device of ``total`` bytes beside the guard's
    workers, else why not: a tuning run that does not fit runs the device out of memory, and
    the guard's checks with it."""
    largest = max((estimate_input_bytes(definition, w) for w in workloads), default=0)
    if INPUT_SETS_ON_DEVICE * largest <= total:
        return None
    gib = 1 << 30
    return (
        f"the largest workload's inputs take {largest / gib:.1f} GiB: a tuning run beside the "
        f"guard's two workers needs about {INPUT_SETS_ON_DEVICE * largest / gib:.0f} GiB of "
        f"the device's {total / gib:.0f} GiB"
    )


class GemmTablesAgent(BuiltinAgent):
    """Tunes the base's GEMMs with TunableOp and ships the table (one base per call)."""

    name = "gemm-tables"
    strategy = "gemm-tables"
    who: ClassVar[str] = "gemm-tables"
    saves_baseline: ClassVar[bool] = True
    waits_for_board: ClassVar[bool] = True
    priority: ClassVar[int] = 5
    description: ClassVar[str] = (
        "TunableOp per-shape cuBLAS/cuBLASLt algorithm tables, shipped as a static table (CUDA)"
    )
    #: ``propose`` runs a tuning subprocess of up to ``timeout_s`` seconds (CUDA only).
    documented_subprocess: ClassVar[bool] = True

    def __init__(self, problem: Problem | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__()
        self._problem = problem
        self.timeout_s = timeout_s
        self._tried: list[str] = []
        self._count = 0
        self._pending: dict[str, Any] | None = None
        self.skipped: str | None = None

    # -------------------------------------------------------------- proposing
    def _bases(self, context: AgentContext) -> list[Base]:
        d = context.definition
        ref = reference_solution(
            d, agent=self.name, description="The reference, as the base of a TunableOp table."
        )
        out = [Base("reference", ref, None, {})]
        others = context.board.others(self.name) if context.board is not None else ()
        for inc in sorted(others, key=lambda i: -i.score):
            if _is_pytorch(inc.solution):
                label = f"incumbent {inc.candidate_id} of {inc.agent}"
                out.append(Base(label, inc.solution, inc.candidate_id, dict(inc.latencies_ms)))
        return [b for b in out if b.solution.content_hash() not in self._tried]

    def _next_base(self, context: AgentContext) -> Base | None:
        bases = self._bases(context)
        if context.must_draft:  # a fresh start: the best other incumbent, else the reference
            board = [b for b in bases if b.parent_id is not None]
            return board[0] if board else (bases[0] if bases else None)
        return bases[0] if bases else None

    def _workloads(self, context: AgentContext) -> list[Workload]:
        if self._problem is not None:
            return list(self._problem.workloads)
        return [Workload(uuid=f"axes-{i}", axes=a) for i, a in enumerate(context.workloads)]

    def propose(self, context: AgentContext) -> Proposal | None:
        if not context.device.startswith("cuda") or tunableop_missing() is not None:
            return None
        if self.skipped is None:
            import torch

            total = torch.cuda.get_device_properties(torch.device(context.device)).total_memory
            self.skipped = fits_beside_guard(context.definition, self._workloads(context), total)
            if self.skipped is not None:
                log.info("gemm-tables proposes nothing: %s", self.skipped)
        if self.skipped is not None:
            return None
        timeout_s = self.tuning_timeout(context)
        if timeout_s < MIN_TUNING_S:
            log.info("gemm-tables proposes nothing: %.0f s left to the search", timeout_s)
            return None
        base = self._next_base(context)
        if base is None:
            return None
        self._tried.append(base.solution.content_hash())
        with tempfile.TemporaryDirectory(prefix="kernelarc-gemm-tables-") as tmp:
            work = Path(tmp)
            job = TuningJob(
                definition=context.definition,
                workloads=self._workloads(context),
                solution=base.solution,
                device=context.device,
                seed=context.seed,
                problem_root=str(self._problem.root) if self._problem is not None else None,
                build_dir=str(work / "build"),
                table_path=str(work / "table.csv"),
                live_path=str(work / "live.csv"),
            )
            run = run_tuning(job, work, timeout_s)
        return self.proposal_from_run(context, base, run)

    def tuning_timeout(self, context: AgentContext) -> float:
        """Seconds the tuning may take: ``timeout_s``, capped by the time left to the search."""
        if context.time_left_s is None:
            return self.timeout_s
        return min(self.timeout_s, context.time_left_s)

    def proposal_from_run(
        self, context: AgentContext, base: Base, run: TuningRun
    ) -> Proposal | None:
        """The second half of :meth:`propose`: the proposal made of a finished tuning run
        (None when the base ran cleanly but no GEMM reached TunableOp)."""
        failure = run.failure()
        if run.table_text is None:
            raise TuningFailed(f"gemm-tables on {base.label}: no table; {failure}\n{run.stderr}")
        try:
            table = parse_table(run.table_text, where=f"tuning table of {base.label}")
        except TableError as e:
            raise TuningFailed(f"gemm-tables on {base.label}: {e}; {failure or 'run ok'}") from e
        device = run.event("device")
        if not table.gemm_entries():
            if failure is None:
                return None
            raise TuningFailed(
                f"gemm-tables on {base.label}: nothing tuned; {failure}\n{run.stderr}"
            )
        if device is None:
            raise TuningFailed(f"gemm-tables on {base.label}: the subprocess never named its GPU")
        tuned_on = TunedOn(
            torch=str(device["torch"]),
            device=str(device["name"]),
            capability=str(device["capability"]),
        )
        self._count += 1
        d = context.definition
        solution = table_solution(
            base.solution,
            table,
            tuned_on,
            agent=self.name,
            name=f"{d.name}-gemm-tables-{self._count}",
        )
        self._classify(context)
        self._baseline_ms = dict(base.baseline_ms)
        n, k = len(table.gemm_entries()), len(table.tuned())
        done = run.event("done")
        errors = list(done.get("errors", [])) if done else []
        note = f"partial table: {failure}" if run.partial else None
        if errors and note is None:
            note = f"{len(errors)} workload(s) failed while tuning: {errors[0][:120]}"
        self._pending = {"base": base.label, "shapes": n, "non_default": k, "note": note}
        draft = context.must_draft
        parent = base.parent_id or (board_parent(context, self.name) if draft else None)
        return Proposal(
            solution=solution,
            hypothesis=clip(
                f"TunableOp tuned {n} GEMM shapes of the {base.label} ({k} chose a non-default "
                f"cuBLAS/cuBLASLt algorithm) on {tuned_on.device}; shipping that table should "
                "make those GEMMs faster without changing the computation.",
                1000,
            ),
            parent_id=parent,
            mode="draft" if draft else "refine",
            tags=("gemm-tables", "tunableop", "reference" if base.parent_id is None else "board"),
        )

    # -------------------------------------------------------------- concluding
    def observe(self, result: CandidateResult) -> Conclusion:
        pending, self._pending = self._pending, None
        if pending is None:
            what = "TunableOp table (unknown base)"
        else:
            what = (
                f"TunableOp table for the {pending['base']}: {pending['shapes']} GEMM shapes "
                f"tuned, {pending['non_default']} non-default"
            )
        effect, overall = self._effect(result)
        n = len(result.per_workload)
        if result.passed:
            verdict = f"{score_text(result)} over eager on {n}/{n} workloads"
            if self._baseline_ms and overall is not None:
                verdict += f", {overall:.2f}x vs its base"
        else:
            verdict = failure_summary(result)
        notes = [pending["note"]] if pending and pending.get("note") else []
        if result.stage == "screen":
            notes.append("screening stage only")
        if result.cached:
            notes.append("cached verdict")
        claim = f"{what}; {verdict}" + (f" ({'; '.join(notes)})" if notes else "")
        return self._conclude(result, claim, effect, ("gemm-tables", "tunableop"), overall)

    # -------------------------------------------------------------- state
    def _state(self) -> dict[str, object]:
        return {
            "tried": list(self._tried),
            "count": self._count,
            "pending": dict(self._pending) if self._pending is not None else None,
        }

    def _restore(self, state: dict[str, object]) -> None:
        tried, pending = state.get("tried", []), state.get("pending")
        if not isinstance(tried, list) or not all(isinstance(t, str) for t in tried):
            raise AgentStateError(
                f"gemm-tables state: 'tried' must be a list of hashes, got {tried!r}"
            )
        count = count_of(state.get("count", 0), self.who)
        if pending is not None and not (
            isinstance(pending, dict)
            and isinstance(pending.get("base"), str)
            and isinstance(pending.get("shapes"), int)
            and isinstance(pending.get("non_default"), int)
            and (pending.get("note") is None or isinstance(pending.get("note"), str))
        ):
            raise AgentStateError(f"gemm-tables state: bad 'pending' {pending!r}")
        self._tried, self._count = list(tried), count
        self._pending = dict(pending) if isinstance(pending, dict) else None


__all__ = [
    "TABLE_FILE",
    "WRAPPER_ENTRY",
    "WRAPPER_FILE",
    "GemmTablesAgent",
    "TunedOn",
    "TuningFailed",
    "TuningRun",
    "run_tuning",
    "table_solution",
    "wrapper_source",
]
