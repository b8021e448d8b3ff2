"""A search run's configuration: recorded in the store, so a resumed run keeps its own."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StageConfig(BaseModel):
    """How much of the guard protocol one stage uses."""

    model_config = ConfigDict(extra="forbid")
    rounds: int = Field(ge=1)
    warmup: int = Field(ge=0)
    iterations: int = Field(ge=3)


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    problem: str
    """The problem directory (as given)."""
    definition: str
    """The definition's name (a resumed run must be for the same problem)."""
    agents: list[str] = Field(min_length=1)
    budget: int = Field(default=16, ge=1)
    """Candidates judged in all (duplicates of judged candidates are free)."""
    budget_per_agent: int | None = Field(default=None, ge=1)
    time_limit_s: float | None = Field(default=None, gt=0)
    device: str = "auto"
    seed: int = 200
    timeout_s: float = Field(default=300.0, gt=0)
    compile_workers: int = Field(default=0, ge=0)
    """Inductor compile workers for the guard's compile pass (``GuardConfig``); 0: none."""
    cupti: str = Field(default="auto", pattern="^(auto|on|off)$")
    """The guard's timer (``GuardConfig.cupti``): CUPTI kernel spans when available (auto),
    or CUDA events (off), e.g. for calls of thousands of kernels, where CUPTI adds about a
    second per call (docs/PERFORMANCE.md)."""
    memory: bool = True
    board: bool = True
    drafting: bool = True
    independent: bool = False
    """Best-of-N: no memory, no board, no drafting, no sharing of any kind."""
    patience: int = Field(default=3, ge=1)
    """Evaluations without a significant gain before an agent must draft."""
    min_gain: float = Field(default=0.02, ge=0)
    """The smallest relative gain that counts as significant (see ``judge.significant``)."""
    memory_file: str | None = None
    memory_top_k: int = Field(default=5, ge=0)
    screen_workloads: int = Field(default=3, ge=1)
    screen: StageConfig = StageConfig(rounds=3, warmup=3, iterations=10)
    full: StageConfig = StageConfig(rounds=10, warmup=10, iterations=50)
    hopeless_factor: float = Field(default=3.0, gt=1)
    """Stop a screening early when the first screened workload is this much slower than
    the best incumbent there."""
    compose: bool = True
    reference_fallback: bool = True
    """Unless the chosen solution is significantly faster than eager
    (``judge.beats_reference``), judge the reference itself in full and hand it over
    instead (see ``finish``)."""
    workloads: list[str] | None = Field(default=None, min_length=1)
    """The uuids of the workloads the run judges (``--workloads``); None: all the problem's.
    A solution found on a subset is verified on that subset only."""
    first_round_wait_s: float = Field(default=10.0, ge=0)
    """How long the first judgement of a process waits for the agents' first proposals
    (less under a time limit with less left; ``schedule.gather_first_round``): the first
    pick is then made among all of them by priority, not by which agent returned first. 0:
    no wait."""
    confirm: bool = True
    """Judge the chosen solution again in a new process with empty JIT caches before handing
    it over, and a runner-up when its speed does not reproduce (``confirm.py``)."""

    @model_validator(mode="after")
    def _independent(self) -> RunConfig:
        if self.independent:
            self.memory = self.board = self.drafting = False
        repeated = sorted({n for n in self.agents if self.agents.count(n) > 1})
        if repeated:
            raise ValueError(f"agent name(s) given twice: {', '.join(repeated)}; give each once")
        return self
