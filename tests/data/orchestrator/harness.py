"""Helpers of ``tests/test_orchestrator.py``: RMSNorm test variants, scripted-agent steps,
an in-process search built as ``kernelarc optimize`` builds it, a kill-and-resume driver for
``run_scripted.py`` and a ``kernelarc`` subprocess runner.

Covered: only what those tests need (the bundled example ``rmsnorm_h512`` on the CPU, the
small screening and full stages). Not covered: anything else; this is test code.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kernelarc.agents.types import AgentContext, CandidateResult, Conclusion, Proposal
from kernelarc.env import parent_environment
from kernelarc.examples import example_dir
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.orchestration.config import RunConfig, StageConfig
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.scripted import ScriptedAgent, Step
from kernelarc.store.base import CandidateRecord, EvaluationRecord, EventRecord
from kernelarc.store.sqlite import SQLiteStore

StepFn = TypeVar("StepFn", bound=Callable[[AgentContext], Proposal])
EXAMPLE = example_dir("rmsnorm_h512")
RUN_SCRIPTED = Path(__file__).resolve().parent / "run_scripted.py"
SCREEN = StageConfig(rounds=2, warmup=1, iterations=3)
FULL = StageConfig(rounds=2, warmup=1, iterations=5)
# The reference is timed with the guard's own protocol: the same small one as the full stage.
GUARD_CONFIG = GuardConfig(device="cpu", timeout=120, rounds=2, warmup=1, iterations=5)
WAIT_S = 300.0
BLOCKED_FIRST_WAIT_S = 1.0
"""The first judgement's wait for the agents' first proposals (``first_round_wait_s``, 10 s)
in a search where an agent's first step waits for another agent's verdict: that proposal
cannot come before the first judgement, so the full wait would only delay the search. 1 s
still gathers every first proposal that is ready at once (its own test keeps the 10 s)."""

SOURCE = '''"""RMSNorm variant {tag} for the orchestrator tests."""

import time

import torch


@torch.no_grad()
def run(hidden_states, weight, output):
    b = hidden_states.shape[0]
    if {fail}:
        raise RuntimeError("variant {tag} fails on purpose")
    if {slow}:
        time.sleep({sleep_s})
    x = hidden_states.to(torch.float32)
    inv = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-6)
    output.copy_(x * inv * weight.to(torch.float32))
'''
SOURCE_LINE = "output.copy_(x * inv * weight.to(torch.float32))"


def rms(tag: str, *, slow: str = "False", sleep_s: float = 0.002, fail: bool = False) -> Solution:
    """A destination-passing RMSNorm named ``rms_<tag>`` (the tag makes its content hash
    unique). ``slow`` is a Python condition on the batch size ``b``: when true, the call
    sleeps ``sleep_s`` seconds first. ``fail``: every call raises."""
    return rms_solution(tag, SOURCE.format(tag=tag, slow=slow, sleep_s=sleep_s, fail=fail))


def rms_solution(tag: str, content: str) -> Solution:
    """A destination-passing solution ``rms_<tag>`` of the example, ``run`` in ``content``."""
    return Solution.model_validate(
        {
            "name": f"rms_{tag}",
            "definition": "ka_rmsnorm_h512",
            "author": "kernelarc-tests",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "m.py::run",
                "destination_passing_style": True,
            },
            "sources": [{"path": "m.py", "content": content}],
        }
    )


def waits_for_a_verdict(step: StepFn) -> StepFn:
    """Marks a step that returns only once another agent has a verdict (see ``search``)."""
    step.waits_for_a_verdict = True  # type: ignore[attr-defined]
    return step


def after(other: ScriptedAgent, n: int, solution: Solution) -> Step:
    """A step that proposes ``solution`` only once ``other`` has observed ``n`` results, so
    that the guard judges ``other``'s candidates first whatever the thread timing."""

    def step(context: AgentContext) -> Proposal:
        deadline = time.monotonic() + WAIT_S
        while len(other.results) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent {other.name} observed nothing within {WAIT_S} s")
            time.sleep(0.01)
        return Proposal(
            solution=solution,
            hypothesis=f"after {other.name}",
            mode="draft" if context.must_draft else "refine",
        )

    return waits_for_a_verdict(step)


class CodeClaimAgent(ScriptedAgent):
    """A scripted agent whose conclusions carry code, which the shared memory must refuse."""

    def observe(self, result: CandidateResult) -> Conclusion:
        honest = super().observe(result)
        return honest.model_copy(update={"claim": "def run(x): return x.sum()"})


@dataclass
class Search:
    """One finished search: the summary and everything its store holds."""

    summary: dict[str, Any]
    run_dir: Path
    agents: dict[str, ScriptedAgent]
    candidates: list[CandidateRecord]
    evaluations: list[EvaluationRecord]
    conclusions: list[Conclusion]
    events: list[EventRecord]
    config: RunConfig = field(repr=False)

    def payloads(self, kind: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.events if e.kind == kind]

    def judged(self) -> list[str]:
        """Candidate ids in the order the guard judged them (composer excluded)."""
        return [p["candidate"] for p in self.payloads("evaluated")]

    def agent_of(self, cid: str) -> str:
        return next(c.agent for c in self.candidates if c.id == cid)

    def ids(self, agent: str) -> list[str]:
        return [c.id for c in self.candidates if c.agent == agent]

    def incumbents_after(self, rounds: int) -> dict[str, str]:
        """Each agent's incumbent (candidate id) once the first ``rounds`` were judged."""
        promoted = {p["candidate"] for p in self.payloads("incumbent")}
        out: dict[str, str] = {}
        for cid in self.judged()[:rounds]:
            if cid in promoted:
                out[self.agent_of(cid)] = cid
        return out

    def describe(self) -> str:
        lines = [json.dumps(self.summary, default=str)[:3000]]
        lines += [f"{e.kind}: {json.dumps(e.payload, default=str)[:300]}" for e in self.events]
        return "\n".join(lines)


def read_store(path: Path) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    store = SQLiteStore(path, readonly=True)
    try:
        return store.candidates(), store.evaluations(), store.conclusions(), store.events()
    finally:
        store.close()


def run_config(problem: Problem, agents: Sequence[str], **overrides: Any) -> RunConfig:
    base: dict[str, Any] = {
        "problem": str(EXAMPLE),
        "definition": problem.definition.name,
        "agents": list(agents),
        "screen": SCREEN,
        "full": FULL,
        "screen_workloads": 2,
        # The scripted variants sleep, so they are slower than the reference: the fallback
        # would replace them at the end of most runs. Its own tests turn it on.
        "reference_fallback": False,
        # Confirming the best in a new process (judged again, then maybe a runner-up) adds
        # judgements to every run, and CPU noise could change the best. Its tests turn it on.
        "confirm": False,
    }
    base.update(overrides)
    return RunConfig.model_validate(base)


def search(
    guard: Guard,
    problem: Problem,
    run_dir: Path,
    agents: Sequence[ScriptedAgent],
    **overrides: Any,
) -> Search:
    """Build the orchestrator as ``kernelarc optimize`` does, run it, read its store. Where
    an agent's first step waits for a verdict, the first judgement waits at most
    ``BLOCKED_FIRST_WAIT_S`` for the first proposals."""
    firsts = [(getattr(a, "steps", None) or [None])[0] for a in agents]  # scripted agents'
    if any(getattr(step, "waits_for_a_verdict", False) for step in firsts):
        overrides.setdefault("first_round_wait_s", BLOCKED_FIRST_WAIT_S)
    config = run_config(problem, [a.name for a in agents], **overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        orch = Orchestrator(problem, list(agents), config, RunDir(run_dir), store, guard, {})
        summary = orch.run()
    finally:
        store.close()
    cands, evals, concl, events = read_store(run_dir / "store.sqlite")
    by_name = {a.name: a for a in agents}
    return Search(summary, run_dir, by_name, cands, evals, concl, events, config)


def fails(prefix: str, n: int) -> list[Step]:
    return [rms(f"{prefix}{i}", fail=True) for i in range(n)]


def plateau_steps(prefix: str) -> list[Step]:
    """A passing candidate, then ever slower ones (5, 10, 15, 20 ms of sleep on every call)."""
    slower: list[Step] = [rms(f"{prefix}{k}", slow="True", sleep_s=0.005 * k) for k in range(1, 5)]
    return [rms(f"{prefix}0"), *slower]


def cli_env() -> dict[str, str]:
    """This process's environment without terminal-size hints."""
    return {k: v for k, v in parent_environment().items() if k not in ("COLUMNS", "LINES")}


@dataclass
class Resumed:
    """A run killed by SIGKILL and resumed to its end: its store and what was proposed."""

    search: Search
    proposals: list[dict[str, Any]]
    first_pid: int
    before_kill: list[str]
    """Candidate ids recorded by the killed process."""


RESUME_STEPS: dict[str, list[Solution]] = {
    # A: a passing candidate, then slower ones (patience 1: a draft on the 3rd proposal).
    "A": [rms("ra0"), *[rms(f"ra{k}", slow="True", sleep_s=0.005 * k) for k in (1, 2, 3)]],
    "B": [rms(f"rb{k}", fail=True) for k in range(4)],
}


def kill_and_resume(tmp: Path, problem: Problem, kill: dict[str, Any]) -> Resumed:
    run_dir = tmp / "run"
    agents = []
    for name, steps in RESUME_STEPS.items():
        paths = []
        for s in steps:
            p = tmp / f"{s.name}.json"
            p.write_text(s.model_dump_json())
            paths.append(str(p))
        agents.append({"name": name, "strategy": name.lower(), "steps": paths})
    config = run_config(problem, list(RESUME_STEPS), budget=6, patience=1)
    spec = {
        "problem": str(EXAMPLE),
        "run_dir": str(run_dir),
        "config": config.model_dump(mode="json"),
        "guard": GUARD_CONFIG.model_dump(mode="json"),
        "agents": agents,
        "kill": kill,
    }
    rcs: list[int] = []
    pids: list[int] = []
    outputs: list[str] = []
    last_lines: list[str] = []
    before: list[str] = []
    try:
        for k in (1, 2):
            path = tmp / f"spec{k}.json"
            path.write_text(json.dumps({**spec, "kill": kill if k == 1 else None}))
            proc = subprocess.Popen(
                [sys.executable, str(RUN_SCRIPTED), str(path)],
                cwd=tmp,
                env=cli_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            out, err = proc.communicate(timeout=300)
            rcs.append(proc.returncode)
            pids.append(proc.pid)
            outputs.append(f"rc={proc.returncode}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-4000:]}")
            last_lines.append(out.strip().splitlines()[-1] if out.strip() else "")
            if k == 1:
                assert proc.returncode == -signal.SIGKILL, outputs[0]
                before = [c.id for c in read_store(run_dir / "store.sqlite")[0]]
    finally:
        tmp_list = run_dir / "guard_tmp.txt"
        for line in tmp_list.read_text().splitlines() if tmp_list.exists() else []:
            if Path(line).exists():  # the killed run left its scratch folder behind
                shutil.rmtree(line)
    assert rcs[1] == 0, outputs[1]
    cands, evals, concl, events = read_store(run_dir / "store.sqlite")
    summary = json.loads(last_lines[1])
    log = (run_dir / "proposals.jsonl").read_text()
    proposals = [json.loads(line) for line in log.splitlines()]
    found = Search(summary, run_dir, {}, cands, evals, concl, events, config)
    return Resumed(found, proposals, pids[0], before)


def kernelarc(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelarc.cli.main", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


STATUS_KEYS = {"budget", "evaluated", "passed", "agents", "conclusions", "candidate_ids", "best"}


def check_status_contract(status: dict[str, Any], run_dir: Path) -> None:
    assert STATUS_KEYS <= set(status), status
    for key in ("budget", "evaluated", "passed", "conclusions"):
        assert isinstance(status[key], int), (key, status)
    assert isinstance(status["candidate_ids"], list), status
    for a in status["agents"]:
        assert {"name", "strategy", "candidates", "conclusions", "incumbent"} <= set(a), a
    best = status["best"]
    assert {"path", "all_passed", "speedup"} <= set(best), best
    assert Path(best["path"]) == run_dir / "best" / "solution.json", best


def example_problem() -> Problem:
    """The bundled example, for a module's ``problem`` fixture:
    ``problem = pytest.fixture(scope="module")(example_problem)``."""
    return load_problem(EXAMPLE)


def example_guard(problem: Problem) -> Iterator[Guard]:
    """One CPU guard for a module's in-process searches, for its ``guard`` fixture:
    ``guard = pytest.fixture(scope="module")(example_guard)``."""
    with Guard(problem, GUARD_CONFIG) as g:
        yield g
