"""How a candidate's worker gets ready (``Guard.candidate_worker``, ``prewarm_inductor``), on
the CPU with the bundled ``rmsnorm_h512`` example.

Covered: the setup reports its parts (the solution's import, torch.compile's preparation) as
``load.*`` phases; by default on the CPU the next spare starts only when a candidate is done
and a compiled solution's worker prepares torch.compile itself; with ``early_spare`` (the
default on CUDA) the next spare starts as soon as a candidate takes its worker and prepares
torch.compile before its first request, and compiled and plain solutions both pass in such
workers (the pre-imported modules raise no finding); the preparation for CUDA answers
Inductor's vector-ISA check without its Python subprocess, the one for the CPU runs it. Not
covered: what this saves on the H200 (benchmarks, docs/PERFORMANCE.md). Each test's guard
or process is its own (a fresh Inductor cache: a cold compile); they run at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead

from kernelarc.examples import example_dir
from kernelarc.guard.evaluator import EvalResult, Guard, GuardConfig
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.reference import make_solution
from kernelarc.problem.schema import Solution
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


def _default_on_the_cpu(problem: Problem, tmp_path: Path) -> tuple[bool, EvalResult]:
    """Whether a spare waited once a candidate took its worker; the compiled solution's
    result (that worker killed: the next candidate gets a new one)."""
    with Guard(problem, _config(tmp_path, None)) as guard:
        worker = guard.candidate_worker()
        no_spare = guard._spare is None
        worker.kill()
        return no_spare, guard.evaluate(_compiled(problem), list(problem.workloads[:1]))


def _early_spare(problem: Problem, tmp_path: Path) -> tuple[bool, EvalResult, EvalResult]:
    """Whether a preparing spare was up at once; the compiled and the plain solution's
    results in the spares that followed."""
    plain = load_solution(example_dir("rmsnorm_h512") / "solution_pytorch.json")
    with Guard(problem, _config(tmp_path, True)) as guard:
        worker = guard.candidate_worker()
        spare = guard._spare
        started = spare is not None and spare.alive() and bool(spare.prewarm)
        worker.kill()
        compiled = guard.evaluate(_compiled(problem), list(problem.workloads[:1]))
        after = guard.evaluate(plain, list(problem.workloads[:1]))
    return started, compiled, after


def _probe(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    return subprocess.run(
        [sys.executable, "-c", PROBE_SCRIPT, mode],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def prepared(
    request: pytest.FixtureRequest, problem: Problem, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """Each test's guard (a fresh cache each) or probe process, started together
    (``_shared``'s ``started_ahead``): the tests check what they found; none of their claims
    is a timing (a phase's share of its own total at most)."""
    isa = "test_the_preparation_settles_the_vector_isa_check"
    jobs: dict[str, Callable[[], Any]] = {
        "test_on_the_cpu_the_compiled_solution_prepares_in_its_own_setup": partial(
            _default_on_the_cpu, problem, tmp_path_factory.mktemp("default")
        ),
        "test_an_early_spare_prepares_torch_compile_before_its_candidate": partial(
            _early_spare, problem, tmp_path_factory.mktemp("early")
        ),
        **{
            f"{isa}[{mode}]": partial(_probe, tmp_path_factory.mktemp("probe"), mode)
            for mode in ("probe", "no-probe")
        },
    }
    yield from started_ahead(request, jobs)


def test_on_the_cpu_the_compiled_solution_prepares_in_its_own_setup(
    prepared: dict[str, Future[Any]],
) -> None:
    no_spare, res = prepared[
        "test_on_the_cpu_the_compiled_solution_prepares_in_its_own_setup"
    ].result()
    assert no_spare  # the next spare waits until this candidate is done
    _passed(res)
    phases = res.phases_s
    assert phases["load.entry"] > 0 and phases["load.prewarm"] > 0, phases
    assert phases["load.prewarm"] + phases["load.entry"] <= phases["load"] + 0.05, phases
    assert "spare_prewarm" not in phases, phases
    assert not any("vector-ISA" in n for n in res.outcomes[0].notes)


def test_an_early_spare_prepares_torch_compile_before_its_candidate(
    prepared: dict[str, Future[Any]],
) -> None:
    started, compiled, after = prepared[
        "test_an_early_spare_prepares_torch_compile_before_its_candidate"
    ].result()
    assert started  # the next spare started at once, preparing
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
def test_the_preparation_settles_the_vector_isa_check(
    prepared: dict[str, Future[Any]], mode: str
) -> None:
    """Before the sentinel is armed: with the probe, Inductor's Python subprocesses run
    during the preparation and none during the compile; without it (CUDA), none at all, and
    a CPU compile still computes the right thing (scalar code)."""
    out = prepared[f"test_the_preparation_settles_the_vector_isa_check[{mode}]"].result()
    assert out.returncode == 0, out.stderr[-3000:]
    during, after = map(int, out.stdout.split()[-2:])
    assert after == 0, out.stdout
    assert (during > 0) == (mode == "probe"), out.stdout
