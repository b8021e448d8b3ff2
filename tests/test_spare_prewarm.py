"""How a candidate's worker gets ready (``Guard.candidate_worker``, ``prewarm_inductor``), on
the CPU with the bundled ``rmsnorm_h512`` example.

Covered: the setup reports its parts (the solution's import, torch.compile's preparation) as
``load.*`` phases; by default on the CPU the next spare starts only when a candidate is done
and a compiled solution's worker prepares torch.compile itself; with ``early_spare`` (the
default on CUDA) the next spare starts as soon as a candidate takes its worker and prepares
torch.compile before its first request, and compiled and plain solutions both pass in such
workers (the pre-imported modules raise no finding); the preparation for CUDA answers
Inductor's vector-ISA check without its Python subprocess, the one for the CPU runs it. Not
covered: what this saves on the H200 (benchmarks, docs/PERFORMANCE.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelarc.examples import example_dir
from kernelarc.guard.evaluator import EvalResult, Guard, GuardConfig
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.schema import Solution
from kernelarc.proposers.builtin import make_solution
from kernelarc.proposers.compiler import COMPILE_VARIANTS, compiled_source


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


def _compiled(problem: Problem) -> Solution:
    return make_solution(
        problem.definition,
        agent="tests",
        name="compiled",
        description="torch.compile of the reference",
        source=compiled_source(problem.definition.reference, COMPILE_VARIANTS[0]),
        entry="kernelarc_entry",
    )


def _config(tmp_path: Path, early: bool | None) -> GuardConfig:
    return GuardConfig(
        device="cpu", warmup=1, iterations=3, rounds=2, early_spare=early,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip


def _passed(res: EvalResult) -> None:
    statuses = [o.status.value for o in res.outcomes]
    assert statuses == ["PASSED"] * len(res.outcomes), [o.log for o in res.outcomes]


def test_on_the_cpu_the_compiled_solution_prepares_in_its_own_setup(
    problem: Problem, tmp_path: Path
) -> None:
    with Guard(problem, _config(tmp_path, None)) as guard:
        worker = guard.candidate_worker()
        assert guard._spare is None  # the next spare waits until this candidate is done
        worker.kill()
        res = guard.evaluate(_compiled(problem), list(problem.workloads[:1]))
    _passed(res)
    phases = res.phases_s
    assert phases["load.entry"] > 0 and phases["load.prewarm"] > 0, phases
    assert phases["load.prewarm"] + phases["load.entry"] <= phases["load"] + 0.05, phases
    assert "spare_prewarm" not in phases, phases
    assert not any("vector-ISA" in n for n in res.outcomes[0].notes)


def test_an_early_spare_prepares_torch_compile_before_its_candidate(
    problem: Problem, tmp_path: Path
) -> None:
    plain = load_solution(example_dir("rmsnorm_h512") / "solution_pytorch.json")
    with Guard(problem, _config(tmp_path, True)) as guard:
        worker = guard.candidate_worker()
        spare = guard._spare
        assert spare is not None and spare.alive() and spare.prewarm  # started at once
        worker.kill()
        compiled = guard.evaluate(_compiled(problem), list(problem.workloads[:1]))
        after = guard.evaluate(plain, list(problem.workloads[:1]))
    for res in (compiled, after):
        _passed(res)
        assert res.phases_s["spare_prewarm"] > 0, res.phases_s
        assert "load.prewarm" not in res.phases_s, res.phases_s
    for res in (compiled, after):  # prepared for the CPU: the probe ran, no note
        assert not any("vector-ISA" in n for n in res.outcomes[0].notes)


PROBE_SCRIPT = """
import sys
started = []
sys.addaudithook(lambda event, args: started.append(args) if event == "subprocess.Popen" else None)
from kernelarc.guard.prewarm import prewarm_inductor
warmed = prewarm_inductor(probe=sys.argv[1] == "probe")
assert not warmed.notes, warmed.notes
def python_children():
    return [a for a in started if str(a[0]) == sys.executable]
during = len(python_children())
import torch
f = torch.compile(lambda x: torch.relu(x) * 2 + 1)
x = torch.randn(64)
torch.testing.assert_close(f(x), torch.relu(x) * 2 + 1)
print(during, len(python_children()) - during)
"""


@pytest.mark.parametrize("mode", ["probe", "no-probe"])
def test_the_preparation_settles_the_vector_isa_check(tmp_path: Path, mode: str) -> None:
    """Before the sentinel is armed: with the probe, Inductor's Python subprocesses run
    during the preparation and none during the compile; without it (CUDA), none at all, and
    a CPU compile still computes the right thing (scalar code)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE_SCRIPT, mode],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    during, after = map(int, out.stdout.split()[-2:])
    assert after == 0, out.stdout
    assert (during > 0) == (mode == "probe"), out.stdout
