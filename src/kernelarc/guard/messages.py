"""The messages on a worker's pipes, one pydantic model per request and reply kind.

The wire stays JSON lines (``protocol.Channel``): the parent sends ``request.wire()``, the
worker reads it back with :func:`read_request` and answers with a reply model's ``wire()``.
Every reply is checked on receipt by :func:`decode`: the expected success model, or an
:class:`ErrorReply`; anything else raises :class:`MalformedReply`, which rejects the
candidate (``check-error``: a reply that cannot be read is never taken as a pass).

Output headers (``SlotWriter.write``, ``Exporter.export``) stay plain objects here: the
reference worker's reader checks each one itself, and a bad header is the candidate's
``output-type`` finding, not a malformed reply. Candidate outputs cross as raw bytes in
files or CUDA IPC handles, never in these messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from kernelarc.problem.schema import Definition, Tolerance, Workload


class Message(BaseModel):
    """Base of every message: unknown fields are refused, in both directions."""

    model_config = ConfigDict(extra="forbid")

    def wire(self) -> dict[str, Any]:
        """The JSON object sent on the pipe."""
        return self.model_dump(mode="json")


# ------------------------------------------------------------------------------ requests


class Policy(Message):
    """What the candidate's sentinel forbids (``sentinel.Policy`` in the worker)."""

    forbidden_roots: list[str]
    problem_name: str
    library_roots: list[str]


class Artifact(Message):
    """A built solution as the worker loads it (``build_base.BuildArtifact``)."""

    builder: str
    root: Path
    module_path: Path
    module_name: str
    symbol: str
    content_hash: str
    log: str = ""
    cached: bool = False


class ReferenceSetup(Message):
    op: Literal["setup"] = "setup"
    device: str
    definition: Definition
    problem_root: str | None = None
    cache_bytes: int = 1 << 30


class CandidateSetup(Message):
    op: Literal["setup"] = "setup"
    device: str
    definition: Definition
    dps: bool
    artifact: Artifact
    policy: Policy


class RunRequest(Message):
    """One correctness round. The reference worker reads ``workload`` and ``seed`` only."""

    op: Literal["run"] = "run"
    workload: Workload
    seed: int
    exchange_dir: str | None = None
    ipc: bool = False
    copy_bytes: int = 0
    reuse_timed: bool = False


class CompareRequest(Message):
    """The reference worker judges a candidate's outputs (``outputs``: their headers)."""

    op: Literal["compare"] = "compare"
    workload: Workload
    seed: int
    outputs: list[dict[str, Any]]
    tolerance: Tolerance
    drop: bool = False


class TimeRequest(Message):
    """The timing protocol (``timing.time_calls``); ``compiled`` is the reference's
    torch.compile, ``one_sample``/``exchange_dir``/``ipc`` are the candidate's."""

    op: Literal["time"] = "time"
    workload: Workload
    seeds: list[int]
    warmup: int
    iterations: int
    min_timed_ms: float = 0.0
    max_iterations: int = 0
    max_timed_ms: float = 0.0
    pool_sets: int = 0
    cupti: bool = False
    compiled: bool = False
    one_sample: bool = False
    exchange_dir: str | None = None
    ipc: bool = False


class WarmRequest(Message):
    """The compile pass (``compile_pool.compile_pass``): one seed per workload."""

    op: Literal["warm"] = "warm"
    workers: int
    workloads: list[Workload]
    seeds: list[int]
    max_s: float


class ReleaseRequest(Message):
    op: Literal["release"] = "release"


class EmulatedRequest(Message):
    op: Literal["emulated"] = "emulated"


class ShutdownRequest(Message):
    op: Literal["shutdown"] = "shutdown"


Request = (
    ReferenceSetup
    | CandidateSetup
    | RunRequest
    | CompareRequest
    | TimeRequest
    | WarmRequest
    | ReleaseRequest
    | EmulatedRequest
    | ShutdownRequest
)

_REQUESTS: dict[str, type[Request]] = {
    "run": RunRequest,
    "compare": CompareRequest,
    "time": TimeRequest,
    "warm": WarmRequest,
    "release": ReleaseRequest,
    "emulated": EmulatedRequest,
    "shutdown": ShutdownRequest,
}


def read_request(role: str, raw: dict[str, Any]) -> Request:
    """The request ``raw`` as its model (``setup`` depends on the worker's ``role``);
    ``ValueError`` for an unknown op or fields that do not fit."""
    op = raw.get("op")
    if op == "setup":
        model: type[Request] = ReferenceSetup if role == "reference" else CandidateSetup
    elif isinstance(op, str) and op in _REQUESTS:
        model = _REQUESTS[op]
    else:
        raise ValueError(f"unknown request op {op!r}")
    return model.model_validate(raw)


# ------------------------------------------------------------------------------ replies


class Ready(Message):
    """The worker's first message, before any request."""

    op: Literal["ready"] = "ready"
    pid: int


class ViolationReport(Message):
    """One sentinel finding (``sentinel.Violation``)."""

    check: str
    detail: str


Status = Literal["ok", "shape", "dtype", "numerical", "type"]


class OutputCheck(Message):
    """One output judged by the official rules (``compare.check_output``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Status
    message: str
    max_absolute_error: float = 0.0
    max_relative_error: float = 0.0
    matched_ratio: float = 0.0
    has_nan: bool = False
    has_inf: bool = False
    rel_l2_error: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class ErrorReply(Message):
    """A request that failed: ``runtime`` (the solution raised), ``outputs`` (a wrong
    number of outputs), ``compile`` (the solution does not load), ``reference`` (the
    reference raised), ``check-error`` (the guard's own code raised)."""

    error: Literal["runtime", "outputs", "compile", "reference", "check-error"]
    message: str = ""
    traceback: str = ""
    log: str = ""
    violations: list[ViolationReport] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)


class Reply(Message):
    """A request done. ``ok`` is required: a reply that does not say so is malformed."""

    ok: Literal[True]


class ReferenceReady(Reply):
    environment: dict[str, Any]


class CandidateReady(Reply):
    violations: list[ViolationReport] = Field(default_factory=list)
    precision: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any]
    notes: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)


class ReferenceRan(Reply):
    """``writes``: the inputs the reference itself wrote in place on this workload."""

    cached: bool
    notes: list[str] = Field(default_factory=list)
    writes: list[str]
    phases_s: dict[str, float] = Field(default_factory=dict)


class Writes(Message):
    """What a candidate's call wrote of its inputs, and the outputs aliasing an input."""

    inputs: list[str]
    aliases: dict[str, str]


class CandidateRan(Reply):
    outputs: list[dict[str, Any]]
    writes: Writes
    violations: list[ViolationReport] = Field(default_factory=list)
    precision: dict[str, Any] = Field(default_factory=dict)
    phases_s: dict[str, float] = Field(default_factory=dict)


class Compared(Reply):
    """``exchange_failed``: the reference worker could not open a CUDA IPC header."""

    checks: list[OutputCheck]
    exchange_failed: str | None = None
    phases_s: dict[str, float] = Field(default_factory=dict)


def _summary(value: dict[str, Any]) -> dict[str, Any]:
    """A timing summary (``timing.TimingResult.summary``) must carry a numeric
    ``median_ms`` (the verdict's latency); its other keys are diagnostics, kept in order."""
    median = value.get("median_ms")
    if isinstance(median, bool) or not isinstance(median, int | float):
        raise ValueError(f"a timing summary needs a numeric median_ms, not {median!r:.50}")
    return value


Summary = Annotated[dict[str, Any], AfterValidator(_summary)]


class ReferenceTimed(Reply):
    summary: Summary
    samples_ms: list[float]


class Sample(Message):
    """A sampled timed call: its input seed and its outputs' headers."""

    seed: int
    outputs: list[dict[str, Any]]


class CandidateTimed(Reply):
    summary: Summary
    samples_ms: list[float]
    pool: int
    sampled: list[Sample]
    one_sample: bool
    phases_s: dict[str, float] = Field(default_factory=dict)
    torch_compile: dict[str, Any] | None = None
    violations: list[ViolationReport] = Field(default_factory=list)
    precision: dict[str, Any] = Field(default_factory=dict)


class Warmed(Reply):
    seconds: float
    called: list[str]
    notes: list[str] = Field(default_factory=list)
    violations: list[ViolationReport] = Field(default_factory=list)


class Emulated(Reply):
    ops: list[str]


class Done(Reply):
    """The answer to ``release`` and ``shutdown``."""


class MalformedReply(ValueError):
    """A worker's reply fits neither the expected model nor :class:`ErrorReply`."""


R = TypeVar("R", bound=Reply)


def decode(raw: dict[str, Any], expected: type[R]) -> R | ErrorReply:
    """``raw`` as ``expected`` (or as an :class:`ErrorReply` when it carries ``error``);
    :class:`MalformedReply` when it is neither."""
    try:
        if "error" in raw:
            return ErrorReply.model_validate(raw)
        return expected.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise MalformedReply(
            f"malformed {expected.__name__} reply ({e.error_count()} problem(s); "
            f"{where}: {first['msg']})"
        ) from None


__all__ = [
    "Artifact",
    "CandidateRan",
    "CandidateReady",
    "CandidateSetup",
    "CandidateTimed",
    "CompareRequest",
    "Compared",
    "Done",
    "Emulated",
    "EmulatedRequest",
    "ErrorReply",
    "MalformedReply",
    "Message",
    "OutputCheck",
    "Policy",
    "Ready",
    "ReferenceRan",
    "ReferenceReady",
    "ReferenceSetup",
    "ReferenceTimed",
    "ReleaseRequest",
    "Reply",
    "Request",
    "RunRequest",
    "Sample",
    "ShutdownRequest",
    "Summary",
    "TimeRequest",
    "ViolationReport",
    "WarmRequest",
    "Warmed",
    "Writes",
    "decode",
    "read_request",
]
