"""The guard's settings (:class:`GuardConfig`), its result for one solution
(:class:`EvalResult`) and the device it judges on (:func:`resolve_device`). Plain data:
the guard itself is ``evaluator.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kernelarc.errors import KernelArcError
from kernelarc.guard.messages import TimeRequest
from kernelarc.guard.verdict import WorkloadOutcome
from kernelarc.problem.schema import Trace, Workload


class GuardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: str = "auto"
    timeout: float = Field(default=300.0, gt=0, description="seconds per workload")
    setup_timeout: float = Field(default=300.0, gt=0)
    build_timeout: float = Field(default=120.0, gt=0)
    rounds: int = Field(default=10, ge=1)
    warmup: int = Field(default=10, ge=0)
    iterations: int = Field(default=50, ge=1)
    min_timed_ms: float = Field(
        default=10.0,
        ge=0,
        description="more timed calls (up to max_iterations) when iterations x the warm-up "
        "median measures less than this; 0 turns the extension off",
    )
    max_iterations: int = Field(default=1000, ge=1)
    max_timed_ms: float = Field(
        default=3000.0,
        ge=0,
        description="fewer timed calls (at least 10) when iterations x the warm-up median "
        "measures more than this; 0 turns the shortening off",
    )
    compile_workers: int = Field(
        default=0,
        ge=0,
        description="Inductor compile workers for a compile pass before judging a solution "
        "that compiles at run time (guard/compile_pool.py; needs a PID namespace); 0 or 1: "
        "no pass, compiling happens in the first calls with one thread",
    )
    pool_sets: int = Field(
        default=0,
        ge=0,
        description="most distinct input sets in a timing pool (0: as many as fit, "
        "see timing.pool_size); the same for candidates and the reference",
    )
    copy_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="tensor inputs this large or larger are fingerprinted, not copied, to find "
        "a candidate's writes to them (guard/call_checks.py): a copy of tens of GB does not fit "
        "beside the inputs and outputs; 0: every tensor input fingerprinted",
    )
    seed: int = 200
    strict_precision: bool = False
    time_reference: bool = True
    retime_reference: bool = False
    """Time the reference again for this evaluation instead of reusing the timing cached
    for the workload and protocol (the search's screenings: candidates screened minutes
    apart are each compared with a reference timed under the same conditions)."""
    time_compiled_reference: bool = False
    cupti: str = Field(default="auto", pattern="^(auto|on|off)$")
    isolation: bool = True
    warm_spare: bool = True
    early_spare: bool | None = None
    """Start the next warm spare as soon as a candidate takes its worker, and have it prepare
    torch.compile (``prewarm.prewarm_inductor``) before its first request, instead of
    starting it when the candidate is done. None: on CUDA devices (their hosts have cores to
    spare; the process start and Inductor's preparation then overlap the previous
    candidate's judging), not on the CPU, where a spare starting beside timed calls slowed
    them."""
    gpu_exchange: bool = True
    """Hand CUDA outputs of 256 MiB or more to the reference worker over CUDA IPC
    (``guard/cuda_ipc.py``) instead of files; the reference worker then runs without
    namespaces (see ``Guard._isolation_of``). Where the driver refuses, the guard falls back
    to files for its lifetime and says so in the workload's notes (docs/GUARD.md)."""
    cache_dir: Path | None = None

    def time_request(self, workload: Workload, seeds: list[int], **extra: Any) -> TimeRequest:
        """A timing request with this configuration's protocol (warm-up, timed calls and
        their limits, pool sets); ``extra`` sets the request's other fields."""
        return TimeRequest(
            workload=workload,
            seeds=seeds,
            warmup=self.warmup,
            iterations=self.iterations,
            min_timed_ms=self.min_timed_ms,
            max_iterations=self.max_iterations,
            max_timed_ms=self.max_timed_ms,
            pool_sets=self.pool_sets,
            **extra,
        )


class EvalResult(BaseModel):
    solution: str
    traces: list[Trace]
    outcomes: list[WorkloadOutcome]
    wall_s: float
    phases_s: dict[str, float] = Field(default_factory=dict)
    stopped_early: str | None = None

    @property
    def all_passed(self) -> bool:
        return all(
            t.evaluation is not None and t.evaluation.status.value == "PASSED" for t in self.traces
        )


def resolve_device(name: str) -> str:
    if name != "auto":
        if name.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise KernelArcError(
                    "--device cuda was asked for, but no CUDA device is "
                    "visible here; use --device cpu"
                )
        elif name != "cpu":
            raise KernelArcError(f"unknown device {name!r}: use auto, cpu or cuda[:N]")
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
