"""A solution that hangs costs one time limit, not one per workload: ``Guard.evaluate`` on a
9-workload copy of the bundled ``rmsnorm_h512`` (CPU) with a solution whose ``run`` sleeps
for 1000 s. The first workload is TIMEOUT after the limit; the other eight are TIMEOUT
without being run (log ``not run: an earlier workload timed out (<uuid>)``, no correctness
or performance), each streamed through ``on_trace`` in order, and the evaluation ends
within twice the limit (the reference is set up before the clock starts; the candidate's
worker is started by the guard beforehand).

Also: a caller's ``stop`` still decides first (the search stops at the first failure and
reports no more workloads than before).

Not covered: timeouts on a GPU, the compile pass's own time limit.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from _shared import write_solution

from kernelarc.guard.config import GuardConfig
from kernelarc.guard.evaluator import NOT_RUN, Guard
from kernelarc.guard.verdict import WorkloadOutcome
from kernelarc.problem.loader import load_problem, load_solution
from kernelarc.problem.schema import EvaluationStatus, Trace

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
LIMIT_S = 8.0
SLEEPER = "import time\n\ndef run(hidden_states, weight, output):\n    time.sleep(1000)\n"


@pytest.fixture(scope="module")
def nine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rmsnorm_h512 with nine workloads (batch sizes 1..9)."""
    root = tmp_path_factory.mktemp("nine")
    shutil.copy(EXAMPLE / "definition.json", root / "definition.json")
    inputs = {"hidden_states": {"type": "random"}, "weight": {"type": "random"}}
    rows = [
        {"uuid": f"nine-b{b}-0000", "axes": {"batch_size": b}, "inputs": inputs}
        for b in range(1, 10)
    ]
    (root / "workload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _config() -> GuardConfig:
    return GuardConfig(
        device="cpu", timeout=LIMIT_S, rounds=1, warmup=1, iterations=3, warm_spare=False
    )


def test_a_hang_costs_one_time_limit_on_nine_workloads(nine: Path, tmp_path: Path) -> None:
    problem = load_problem(nine)
    solution = load_solution(write_solution(tmp_path / "sol", SLEEPER, "sleeper"))
    streamed: list[Trace] = []
    with Guard(problem, _config()) as guard:
        guard.reference()  # set up before the clock starts
        t0 = time.monotonic()
        result = guard.evaluate(solution, on_trace=streamed.append)
        wall = time.monotonic() - t0
    uuids = [w.uuid for w in problem.workloads]
    assert [t.workload.uuid for t in result.traces] == uuids
    assert streamed == result.traces
    statuses = [t.evaluation.status for t in result.traces if t.evaluation is not None]
    assert statuses == [EvaluationStatus.TIMEOUT] * 9
    first, *rest = (t.evaluation for t in result.traces if t.evaluation is not None)
    assert f"time limit of {LIMIT_S:.0f} s" in first.log, first.log
    for ev in rest:
        assert ev.log.startswith(f"{NOT_RUN}an earlier workload timed out ({uuids[0]})"), ev.log
        assert ev.correctness is None and ev.performance is None
    assert result.stopped_early == f"TIMEOUT on workload {uuids[0]}"
    assert not result.all_passed
    assert wall < 2 * LIMIT_S, f"{wall:.1f} s for a {LIMIT_S:.0f} s limit on 9 workloads"


def test_a_callers_stop_decides_first(tmp_path: Path) -> None:
    """With ``stop`` ending the evaluation at the timeout, no not-run workloads are added."""
    problem = load_problem(EXAMPLE)
    solution = load_solution(write_solution(tmp_path / "sol", SLEEPER, "sleeper"))
    seen: list[WorkloadOutcome] = []

    def stop(o: WorkloadOutcome) -> str | None:
        seen.append(o)
        return "caller stopped"

    cfg = _config().model_copy(update={"timeout": 3.0})
    with Guard(problem, cfg) as guard:
        result = guard.evaluate(solution, problem.workloads[:3], stop=stop)
    assert [o.status for o in result.outcomes] == [EvaluationStatus.TIMEOUT]
    assert len(seen) == 1 and len(result.traces) == 1
    assert result.stopped_early == "caller stopped"
