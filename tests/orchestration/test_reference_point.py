"""Reference points (``Proposal.reference_point``): judged with the full protocol whenever the
screening passes and the full stage fits half the time left, promising or not.

Covered, with a real CPU guard and scripted agents (FAKE strategies): the same slower
candidate is judged in full when proposed as a reference point and only screened when not;
the time rule (``Judge._affordable``), a compiled one's compiling counted once; the compiler
agent marks torch.compile's baseline of the reference, and nothing else, as one. Not
covered: the cost on a GPU under a time limit (the estimate against the full stages of
compiled candidates measured on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from data.orchestrator.harness import (
    EXAMPLE,
    GUARD_CONFIG,
    rms,
    run_config,
    search,
    waits_for_a_verdict,
)

from kernelarc.agents.types import AgentContext, Proposal
from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration.judge import Judge
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.scripted import ScriptedAgent

#: 5 ms slower on every workload (not a shape winner anywhere); the runs raise the hopeless
#: factor so that its screening is not stopped.
SLOW = "True"


@pytest.fixture(scope="module")
def judged() -> Iterator[tuple[Problem, Guard]]:
    """The example problem and one CPU guard for this module."""
    problem = load_problem(EXAMPLE)
    with Guard(problem, GUARD_CONFIG) as guard:
        yield problem, guard


def _after(
    first: ScriptedAgent, solution: Solution, point: bool
) -> Callable[[AgentContext], Proposal]:
    """``solution`` once ``first`` has its verdict (its incumbent then exists)."""

    def step(context: AgentContext) -> Proposal:
        import time

        deadline = time.monotonic() + 300
        while not first.results and time.monotonic() < deadline:
            time.sleep(0.01)
        return Proposal(solution=solution, hypothesis="slower", reference_point=point)

    return waits_for_a_verdict(step)


def test_a_reference_point_is_judged_in_full_where_the_same_candidate_is_not(
    judged: tuple[Problem, Guard], tmp_path: Path
) -> None:
    """A fast; then C, slower, an ordinary proposal; then B, as slow, a reference point
    (each waits for the one before: C is judged while A is the only incumbent, and so is B,
    C having none)."""
    a = ScriptedAgent([rms("rp_a")], name="A")
    c = ScriptedAgent([_after(a, rms("rp_c", slow=SLOW, sleep_s=0.005), False)], name="C")
    b = ScriptedAgent([_after(c, rms("rp_b", slow=SLOW, sleep_s=0.005), True)], name="B")
    problem, guard = judged
    run = search(guard, problem, tmp_path, [a, b, c], budget=3, hopeless_factor=1000.0)
    for agent, stages in (("C", ["screen"]), ("B", ["screen", "full"])):
        (cid,) = run.ids(agent)
        evals = [e for e in run.evaluations if e.candidate_id == cid]
        assert evals[0].result.passed and evals[0].result.stopped_early is None, run.describe()
        assert [e.stage for e in evals] == stages, run.describe()


def test_a_reference_point_takes_at_most_half_the_time_left(judged: tuple[Problem, Guard]) -> None:
    problem, guard = judged
    left = [100.0]
    judge = Judge(guard, run_config(problem, ["A"]), {}, time_left=lambda: left[0])
    assert len(judge.screen_set) == 2 and len(judge.all) == 6  # the estimate: 3x a screening
    assert judge._affordable(16.0) and not judge._affordable(17.0)
    left[0] = 10.0
    assert not judge._affordable(2.0)
    assert Judge(guard, run_config(problem, ["A"]), {})._affordable(1e9), "no time limit"


def test_a_compiled_reference_points_compiling_is_counted_once(
    judged: tuple[Problem, Guard],
) -> None:
    from kernelarc.orchestration.judge import compile_once_s, full_cost_estimate

    problem, guard = judged
    judge = Judge(guard, run_config(problem, ["A"]), {}, time_left=lambda: 100.0)
    # 2 of 6 screened in 17 s: scaled whole 51 s, over half the time left; with its 14 s of
    # compiling counted once, 14 + 3 x 3 = 23 s
    assert full_cost_estimate(17.0, 6, 2, 14.0) == pytest.approx(23.0)
    assert not judge._affordable(17.0) and judge._affordable(17.0, 14.0)
    assert full_cost_estimate(17.0, 6, 2, 40.0) == pytest.approx(17.0), "at most the whole"
    plain = rms("rp_plain")
    src = next(f for f in plain.sources if f.path.endswith(".py"))
    compiled = plain.model_copy(
        update={"sources": [src.model_copy(update={"content": src.content + "\n# torch.compile"})]}
    )
    phases = {"correctness": 14.0, "timing": 2.0}
    assert compile_once_s(compiled, phases) == 14.0 and compile_once_s(plain, phases) == 0.0
    assert compile_once_s(compiled, {}) == 0.0, "no phases recorded: scaled whole"


def test_the_compiler_marks_only_torch_compiles_baseline_of_the_reference(
    judged: tuple[Problem, Guard],
) -> None:
    problem = judged[0]
    from kernelarc.proposers.compiler import BASELINE, CompilerAgent

    agent = CompilerAgent()
    ctx = AgentContext(
        problem=problem.definition.name, definition=problem.definition, device="cpu",
        workloads=tuple(dict(w.axes) for w in problem.workloads),
        tolerances=tuple(w.tolerance for w in problem.workloads), budget_left=4,
    )  # fmt: skip
    first, second = agent.propose(ctx), agent.propose(ctx)
    assert first is not None and second is not None
    assert first.reference_point and BASELINE in first.tags
    assert not second.reference_point and BASELINE not in second.tags
