"""Run (or resume) one scripted search in its own process, for ``tests/test_orchestrator.py``.

Usage: ``python run_scripted.py SPEC.json``. The spec (written by the test) names the problem
directory, the run directory, the ``RunConfig`` and ``GuardConfig`` (as JSON), the scripted
agents (name, strategy, steps as solution JSON files; ``null`` for "nothing more") and an
optional kill point ``{"event": KIND, "nth": N}``: at the N-th event of that kind this
process sends itself SIGKILL (no cleanup of any kind, like a crash or an OOM kill). An agent
with ``"hang": true`` never returns from ``propose`` (a model call or a tuning that does not
end): it logs that it was asked, then blocks for good.

Every proposal is appended to ``proposals.jsonl`` in the run directory (pid, agent, solution
name, mode) and fsynced before it is returned, so the test sees what was proposed even when
the process dies right after. The guard's scratch folder is appended to ``guard_tmp.txt`` for
the test to remove after a kill. Not covered: anything beyond what the orchestrator's tests
need; this is a test harness, not a tool.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kernelarc.agents.base import Agent
from kernelarc.agents.types import AgentContext, Proposal
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.orchestration.config import RunConfig
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.scripted import ScriptedAgent, Step
from kernelarc.store.sqlite import SQLiteStore


class LoggingAgent(ScriptedAgent):
    """A scripted agent that records each proposal durably before handing it over."""

    def __init__(
        self, steps: list[Step], *, name: str, strategy: str, log: Path, hang: bool = False
    ) -> None:
        super().__init__(steps, name=name, strategy=strategy)
        self.log = log
        self.hang = hang

    def _write(self, entry: dict[str, Any]) -> None:
        with open(self.log, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def propose(self, context: AgentContext) -> Proposal | None:
        if self.hang:
            self._write({"pid": os.getpid(), "agent": self.name, "hangs": context.time_left_s})
            threading.Event().wait()
        proposal = super().propose(context)
        entry = {
            "pid": os.getpid(),
            "agent": self.name,
            "solution": None if proposal is None else proposal.solution.name,
            "mode": None if proposal is None else proposal.mode,
        }
        self._write(entry)
        return proposal


def main(spec_path: str) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    run_dir = Path(spec["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    problem = load_problem(Path(spec["problem"]))
    config = RunConfig.model_validate(spec["config"])
    log = run_dir / "proposals.jsonl"
    agents: list[Agent] = []
    for a in spec["agents"]:
        steps: list[Step] = [
            None if p is None else Solution.model_validate_json(Path(p).read_text())
            for p in a["steps"]
        ]
        agents.append(
            LoggingAgent(
                steps, name=a["name"], strategy=a["strategy"], log=log, hang=a.get("hang", False)
            )
        )
    kill: dict[str, Any] | None = spec.get("kill")
    seen: dict[str, int] = {}

    def on_event(kind: str, payload: dict[str, Any]) -> None:
        seen[kind] = seen.get(kind, 0) + 1
        if kill is not None and kind == kill["event"] and seen[kind] == kill["nth"]:
            os.kill(os.getpid(), signal.SIGKILL)

    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        with Guard(problem, GuardConfig.model_validate(spec["guard"])) as guard:
            with open(run_dir / "guard_tmp.txt", "a") as f:
                f.write(f"{guard.tmp}\n")
            orch = Orchestrator(
                problem, agents, config, RunDir(run_dir), store, guard, {}, on_event=on_event
            )
            summary = orch.run()
    finally:
        store.close()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
