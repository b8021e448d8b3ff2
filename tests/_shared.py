"""Test helpers shared by several test files."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kernelarc import env
from kernelarc.problem.schema import EvaluationStatus, Trace


def shared_problems_root() -> Path:
    """The SOL-ExecBench problem tree beside the project (or $KERNELARC_PROBLEMS); the
    calling test is skipped when it is absent."""
    configured = env.shared_problems()
    root = configured or Path(__file__).resolve().parents[1] / ".." / "shared" / "problems"
    if not root.is_dir():
        pytest.skip(f"no shared problem tree at {root}")
    return root


def write_solution(folder: Path, source: str, name: str) -> Path:
    """A solution.json for the bundled rmsnorm_h512 example whose one source file ``s.py``
    lies beside it (no inline content: the loader reads the file)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.py").write_text(source)
    sol = {
        "name": name,
        "definition": "ka_rmsnorm_h512",
        "author": "kernelarc-tests",
        "spec": {
            "languages": ["pytorch"],
            "entry_point": "s.py::run",
            "destination_passing_style": True,
        },
        "sources": [{"path": "s.py"}],
    }
    path = folder / "solution.json"
    path.write_text(json.dumps(sol, indent=2))
    return path


WITH_CORRECTNESS = ("PASSED", "INCORRECT_NUMERICAL")


def check_trace_lines(
    lines: list[str], uuids: list[str], statuses: list[str], context: str
) -> list[Trace]:
    """Parse trace JSONL lines and check each against the expected status: workload uuid,
    status, correctness/performance present exactly when the status carries them, the
    REWARD_HACK log prefix and the isolation line. ``context`` is added to failures."""
    assert len(lines) == len(statuses), context
    traces = [Trace.model_validate_json(line) for line in lines]
    for trace, wl_uuid, want in zip(traces, uuids, statuses, strict=True):
        ev = trace.evaluation
        assert ev is not None, context
        detail = f"{wl_uuid}: {ev.status.value}, log:\n{ev.log[:2000]}\n{context}"
        assert trace.workload.uuid == wl_uuid, detail
        assert ev.status == EvaluationStatus(want), detail
        assert (ev.correctness is not None) == (want in WITH_CORRECTNESS), detail
        assert (ev.performance is not None) == (want == "PASSED"), detail
        if want == "PASSED":
            assert ev.performance is not None and ev.performance.latency_ms > 0, detail
        assert ev.log.startswith("REWARD_HACK[") == (want == "REWARD_HACK"), detail
        assert "isolation: " in ev.log, detail
    return traces


def agent_context(problem: Any, **fields: Any) -> Any:
    """A plain :class:`~kernelarc.agents.types.AgentContext` for ``problem`` on the CPU
    (every workload, budget 10); ``fields`` override or add."""
    from kernelarc.agents.types import AgentContext

    base: dict[str, Any] = {
        "problem": problem.definition.name,
        "definition": problem.definition,
        "device": "cpu",
        "workloads": tuple(dict(w.axes) for w in problem.workloads),
        "budget_left": 10,
    }
    base.update(fields)
    return AgentContext.model_validate(base)


def module_from_source(source: str, name: str = "solution") -> types.ModuleType:
    """A module made from one file's source text (a generated solution, say)."""
    mod = types.ModuleType(name)
    exec(compile(source, f"{name}.py", "exec"), mod.__dict__)
    return mod


def incumbent_view(agent: str, cid: str, score: float, solution: Any) -> Any:
    """A board entry: ``agent``'s incumbent ``cid`` (strategy = agent, no latencies)."""
    from kernelarc.agents.types import IncumbentView

    fields = {"agent": agent, "strategy": agent, "candidate_id": cid, "score": score}
    return IncumbentView(**fields, latencies_ms={}, solution=solution)


def moe_loop_problem(root: Path, name: str, reference: str) -> Any:
    """A small float32 MoE problem (``x [tokens, 8]``, ``router [tokens, 6]``, ``w [6, 8, 8]``
    → ``y [tokens, 8]``) with ``reference`` as its reference and two workloads (5 and 40
    tokens), written under ``root`` and loaded."""
    from kernelarc.problem.loader import load_problem

    definition = {
        "name": name,
        "axes": {"tokens": {"type": "var"}, "experts": {"type": "const", "value": 6},
                 "hidden": {"type": "const", "value": 8}},
        "inputs": {
            "x": {"shape": ["tokens", "hidden"], "dtype": "float32"},
            "router": {"shape": ["tokens", "experts"], "dtype": "float32"},
            "w": {"shape": ["experts", "hidden", "hidden"], "dtype": "float32"},
        },
        "outputs": {"y": {"shape": ["tokens", "hidden"], "dtype": "float32"}},
        "reference": reference,
    }  # fmt: skip
    (root / "definition.json").write_text(json.dumps(definition))
    lines = [{"uuid": f"moe-t{t}", "axes": {"tokens": t}, "inputs": {}} for t in (5, 40)]
    (root / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in lines))
    return load_problem(root)


def cpu_guard_verdict(problem: Any, proposal: Any, cache_dir: Path) -> tuple[Any, list[Any]]:
    """``proposal``'s solution (through its JSON form, as a user would hand it over) judged
    by a real CPU guard with a small protocol: the evaluation and its (status, log head)
    per workload."""
    from kernelarc.guard.evaluator import Guard, GuardConfig
    from kernelarc.problem.schema import Solution

    sol = Solution.model_validate(proposal.solution.model_dump(mode="json"))
    config = GuardConfig(device="cpu", rounds=2, warmup=1, iterations=3, cache_dir=cache_dir)
    with Guard(problem, config) as guard:
        ev = guard.evaluate(sol)
    return ev, [(o.status.value, o.log[:300]) for o in ev.outcomes]


def batched_runs(module: types.ModuleType, helper: str) -> list[bool]:
    """Records, for every later run of a rewritten ``module``, whether its run-time helper
    class ``helper`` chose the batched branch (``ok``) or the loop as written."""
    cls = module.__dict__[helper]
    seen: list[bool] = []
    init = cls.__init__

    def spy(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        seen.append(self.ok)

    cls.__init__ = spy
    return seen


LANES = 2
"""Jobs that ``started_ahead`` runs at once: the CI machine's two cores, of which a serial
test run keeps one mostly idle (a guard's work is one process at a time)."""


def started_ahead(
    request: pytest.FixtureRequest, jobs: dict[str, Callable[[], Any]]
) -> Iterator[dict[str, Future[Any]]]:
    """For a module-scoped fixture: the jobs of the tests this session selected in the
    module, started at once, ``LANES`` at a time, in the order given. A job's name is its
    test's (``item.name``) or that of a fixture the tests use; each test waits for its own
    future (``result()`` re-raises what the job raised). The fixture's end waits for every
    job. Only for jobs whose outcome does not depend on timing: they share the machine with
    each other (as on a loaded machine)."""
    items = [i for i in request.session.items if i.path == request.node.path]
    selected = {i.name for i in items} | {f for i in items for f in getattr(i, "fixturenames", ())}
    with ThreadPoolExecutor(LANES) as pool:
        yield {name: pool.submit(job) for name, job in jobs.items() if name in selected}
