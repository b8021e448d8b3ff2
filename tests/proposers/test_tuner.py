"""The tuner agent, the seed agent and ``--seed-solution``. The tunables finder and rewriter
are in test_tunables.py; the Triton sources in ``tests/data/tuner/sources.py``.

Covered: the tuner's choice of bases from the board (Triton only, best first, switching to
a better new one), its coordinate descent (kept moves, direction, no repeats, convergence),
conclusions and state round trip; a tuned candidate judged by the real guard on the CPU
(``TRITON_INTERPRET=1``, set by the guard); seed + tuner through the real orchestrator,
where the tuner takes up the seed's incumbent from the board; ``kernelarc optimize
--agents tuner --seed-solution`` in a subprocess (started with the module's first test, run
beside the others) and its errors for bad files.

Not covered: CUDA timings (no GPU here), ``tl.dot`` kernels under the guard (the
interpreter is too slow for matmuls in a unit test; their sources are only rewritten).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import agent_context, started_ahead
from data.orchestrator.harness import GUARD_CONFIG, cli_env, read_store, run_config
from data.tuner.sources import RMS_LITERAL, RMS_ROWS, differing_tokens, triton_solution

from kernelarc.agents.conformance import check_agent
from kernelarc.agents.types import (
    BoardSnapshot,
    CandidateResult,
    IncumbentView,
    WorkloadResult,
)
from kernelarc.examples import example_dir
from kernelarc.guard.evaluator import Guard
from kernelarc.orchestration.judge import results_of, score_of
from kernelarc.orchestration.orchestrator import Orchestrator
from kernelarc.orchestration.rundir import RunDir
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import Solution
from kernelarc.proposers.seed import SeedAgent
from kernelarc.proposers.tunables import solution_tunables
from kernelarc.proposers.tuner import TunerAgent
from kernelarc.store.sqlite import SQLiteStore

KERNELARC = Path(sys.executable).parent / "kernelarc"


# ------------------------------------------------------------------------------ tuner


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


def _view(agent: str, cid: str, score: float, solution: Solution, ms: float = 1.0):
    return IncumbentView(
        agent=agent,
        strategy=agent,
        candidate_id=cid,
        score=score,
        latencies_ms={"a": ms, "b": ms},
        solution=solution,
    )


def _board(*views: IncumbentView) -> BoardSnapshot:
    return BoardSnapshot(incumbents=views, version=len(views))


def _verdict(cid: str, ms: float, *, passed: bool = True, stage: str = "full"):
    status = "PASSED" if passed else "RUNTIME_ERROR"
    per = tuple(
        WorkloadResult(
            uuid=u,
            axes={"batch_size": b},
            status=status,
            latency_ms=ms if passed else None,
            reference_ms=2.0,
            log="" if passed else "triton.CompilationError: out of resources",
        )
        for u, b in (("a", 1), ("b", 128))
    )
    return CandidateResult(
        candidate_id=cid,
        agent="tuner",
        strategy="tuner",
        mode="refine",
        stage=stage,  # type: ignore[arg-type]
        per_workload=per,
        passed=passed,
        score=score_of(per) if passed else None,
    )


def test_no_triton_candidate_means_none(problem: Problem) -> None:
    tuner = TunerAgent()
    assert TunerAgent.waits_for_board is True
    assert tuner.propose(agent_context(problem)) is None
    ref = Solution.model_validate(
        {
            "name": "ref",
            "definition": problem.definition.name,
            "author": "t",
            "spec": {"languages": ["pytorch"], "entry_point": "m.py::run"},
            "sources": [{"path": "m.py", "content": problem.definition.reference}],
        }
    )
    assert (
        tuner.propose(agent_context(problem, board=_board(_view("compiler", "c1", 3.0, ref))))
        is None
    )
    computed = RMS_ROWS.replace("ROWS = 2", "ROWS = min(2, 4)").replace(
        "num_warps=4", "num_warps=max(4, 1)"
    )
    untunable = triton_solution(computed)
    assert solution_tunables(untunable).params == ()
    assert (
        tuner.propose(agent_context(problem, board=_board(_view("x", "c2", 2.0, untunable))))
        is None
    )


def test_bases_best_triton_first_then_a_better_newcomer(problem: Problem) -> None:
    a = triton_solution(RMS_ROWS, "a")
    b = triton_solution(RMS_LITERAL, "b")
    tuner = TunerAgent()
    board = _board(_view("llm", "c1", 1.2, b), _view("seed", "c2", 1.5, a))
    p1 = tuner.propose(agent_context(problem, board=board))
    assert p1 is not None and p1.parent_id == "c2" and "seed's Triton candidate c2" in p1.hypothesis
    assert differing_tokens(a.sources[0].content, p1.solution.sources[0].content) == [("4", "8")]
    assert p1.solution.author == "kernelarc:tuner" and p1.solution.spec == a.spec
    tuner.observe(_verdict("c3", 1.0))  # no gain (same latency as the base)
    better = triton_solution(RMS_ROWS.replace("num_warps=4", "num_warps=2"), "c")
    board2 = _board(*board.incumbents, _view("rewrite", "c9", 2.5, better))
    p2 = tuner.propose(agent_context(problem, board=board2))
    assert p2 is not None and p2.parent_id == "c9" and "better Triton incumbent" in p2.hypothesis
    assert [b.candidate_id for b in tuner.bases()] == ["c2", "c1", "c9"]


def test_coordinate_descent_keeps_gains_and_never_repeats(problem: Problem) -> None:
    seed = triton_solution(RMS_ROWS)
    tuner = TunerAgent()
    ctx = agent_context(problem, board=_board(_view("seed", "c1", 2.0, seed, ms=1.0)))
    seen = {seed.content_hash()}
    p = tuner.propose(ctx)
    assert p is not None and p.tags == ("tuner", "set", "num_warps")
    c = tuner.observe(_verdict("c2", 0.8))
    assert c.claim.startswith("num_warps 4->8 on seed's c1: 1.25x on large: batch_size>16;")
    assert c.claim.endswith("vs the base's best; kept") and c.outcome == "improved"
    assert c.effect == {"large: batch_size>16": 1.25, "small: batch_size<=16": 1.25}
    seen.add(p.solution.content_hash())
    p = tuner.propose(ctx)  # the kept direction first, from the new best
    assert p is not None and p.parent_id == "c2" and "num_warps=16" in p.solution.sources[0].content
    c = tuner.observe(_verdict("c3", 0.9))
    assert c.outcome == "regressed" and c.claim.endswith("not kept")
    labels = []
    for i in range(20):
        seen.add(p.solution.content_hash())
        p = tuner.propose(ctx)
        if p is None:
            break
        assert p.solution.content_hash() not in seen
        labels.append(p.hypothesis.split(" on ")[0])
        failed = tuner.observe(_verdict(f"c{i + 4}", 0.0, passed=False))
        assert failed.outcome == "failed" and "RUNTIME_ERROR" in failed.claim
    # From the best (num_warps=8, ROWS=2): 8->4 is the seed itself, so never proposed.
    assert labels == ["ROWS 2->4", "ROWS 2->1"], labels
    assert tuner.bases()[0].done and tuner.bases()[0].kept == ["num_warps 4->8"]


def test_draft_switches_base_and_tries_are_capped(problem: Problem) -> None:
    a, b = triton_solution(RMS_ROWS, "a"), triton_solution(RMS_LITERAL, "b")
    tuner = TunerAgent(max_tries_per_base=2)
    ctx = agent_context(problem, board=_board(_view("x", "c1", 2.0, a), _view("y", "c2", 1.0, b)))
    first = tuner.propose(ctx)
    assert first is not None and first.parent_id == "c1" and first.mode == "refine"
    tuner.observe(_verdict("c3", 1.0))
    draft = tuner.propose(ctx.model_copy(update={"must_draft": True}))
    assert draft is not None and draft.mode == "draft" and draft.parent_id == "c2"
    assert "a draft: another base" in draft.hypothesis
    tuner.observe(_verdict("c4", 1.0))
    parents = []
    while (p := tuner.propose(ctx)) is not None:
        parents.append(p.parent_id)
        tuner.observe(_verdict(f"c{len(parents) + 4}", 1.0))
    assert parents == ["c2", "c1"], "two tries per base, then both are finished"
    assert all(b.done and b.tries == 2 for b in tuner.bases())


def test_screen_only_pass_is_not_kept(problem: Problem) -> None:
    tuner = TunerAgent()
    ctx = agent_context(problem, board=_board(_view("seed", "c1", 2.0, triton_solution(RMS_ROWS))))
    assert tuner.propose(ctx) is not None
    c = tuner.observe(_verdict("c2", 0.5, stage="screen"))
    assert "screening only" in c.claim and c.claim.endswith("not kept")
    assert tuner.bases()[0].best_id == "c1"


def test_tuner_state_round_trip_and_bad_state(problem: Problem) -> None:
    tuner = TunerAgent(max_tries_per_base=5)
    ctx = agent_context(problem, board=_board(_view("seed", "c1", 2.0, triton_solution(RMS_ROWS))))
    assert tuner.propose(ctx) is not None
    tuner.observe(_verdict("c2", 0.8))
    assert tuner.propose(ctx) is not None  # pending
    saved = json.loads(json.dumps(tuner.state()))
    twin = TunerAgent()
    twin.restore(saved)
    assert twin.state() == tuner.state() and twin.max_tries_per_base == 5
    assert twin.observe(_verdict("c3", 0.7)) == tuner.observe(_verdict("c3", 0.7))
    a, b = tuner.propose(ctx), twin.propose(ctx)
    assert a is not None and b is not None and a.solution == b.solution
    for bad, why in (
        ({"bases": "nope"}, "does not validate"),
        ({"active": "c7"}, "not among its bases"),
        ({"max_tries_per_base": 0}, "max_tries_per_base"),
        ({"surprise": 1}, "does not validate"),
        ({**saved, "bases": saved["bases"] * 2}, "twice"),
    ):
        with pytest.raises(ValueError, match=why):
            TunerAgent().restore(bad)


# ------------------------------------------------------------------------------ seed


def test_seed_agent_proposes_each_once_in_order(problem: Problem) -> None:
    one, two = triton_solution(RMS_ROWS, "one"), triton_solution(RMS_LITERAL, "two")
    seed = SeedAgent([one, two])
    p = seed.propose(agent_context(problem, must_draft=True))
    assert p is not None and p.solution == one and p.mode == "draft"
    c = seed.observe(_verdict("c1", 1.0))
    assert c.claim.startswith("seed 'one' (1/2): 2.00x over eager on 2/2 workloads")
    assert c.outcome == "no_gain" and c.strategy == "seed"
    saved = json.loads(json.dumps(seed.state()))
    p = seed.propose(agent_context(problem))
    assert p is not None and p.solution == two and p.mode == "refine"
    assert "failed on 2/2 workloads" in seed.observe(_verdict("c2", 0, passed=False)).claim
    assert seed.propose(agent_context(problem)) is None
    twin = SeedAgent([one, two])
    twin.restore(saved)
    again = twin.propose(agent_context(problem))
    assert again is not None and again.solution == two
    with pytest.raises(ValueError, match="other seed solutions"):
        SeedAgent([two, one]).restore(saved)
    with pytest.raises(ValueError, match="index"):
        SeedAgent([one]).restore({"index": 5})
    with pytest.raises(ValueError, match="at least one"):
        SeedAgent([])


def test_agent_conformance(problem: Problem) -> None:
    check_agent(TunerAgent, problem)
    check_agent(lambda: SeedAgent([triton_solution(RMS_ROWS)]), problem)


# ------------------------------------------------------------------------------ real guard


@pytest.fixture(scope="module")
def small_problem(tmp_path_factory: pytest.TempPathFactory, problem: Problem) -> Path:
    """The rmsnorm_h512 example with two workloads (batch 3 and 16): the interpreter is slow."""
    root = tmp_path_factory.mktemp("rms2")
    src = example_dir("rmsnorm_h512")
    (root / "definition.json").write_text((src / "definition.json").read_text())
    lines = [ln for ln in (src / "workload.jsonl").read_text().splitlines() if ln.strip()]
    keep = [ln for ln in lines if json.loads(ln)["axes"]["batch_size"] in (3, 16)]
    assert len(keep) == 2
    (root / "workload.jsonl").write_text("\n".join(keep) + "\n")
    return root


@pytest.fixture(scope="module")
def guard(small_problem: Path) -> Iterator[Guard]:
    with Guard(load_problem(small_problem), GUARD_CONFIG) as g:
        yield g


def _candidate_result(ev, cid: str) -> CandidateResult:
    per = results_of(ev.outcomes, {})
    passed = bool(per) and all(r.status == "PASSED" for r in per)
    return CandidateResult(
        candidate_id=cid,
        agent="tuner",
        strategy="tuner",
        mode="refine",
        stage="full",
        per_workload=per,
        passed=passed,
        score=score_of(per) if passed else None,
    )


def test_tuned_candidate_passes_the_real_guard(small_problem: Path, guard: Guard) -> None:
    problem = load_problem(small_problem)
    seed = triton_solution(RMS_ROWS)
    base = _candidate_result(guard.evaluate(seed), "c1")
    assert base.passed, [(r.status, r.log[:500]) for r in base.per_workload]
    view = IncumbentView(
        agent="seed",
        strategy="seed",
        candidate_id="c1",
        score=base.score or 1.0,
        latencies_ms={r.uuid: r.latency_ms or 0.0 for r in base.per_workload},
        solution=seed,
    )
    tuner = TunerAgent()
    proposal = tuner.propose(agent_context(problem, board=_board(view)))
    assert proposal is not None and "num_warps=8" in proposal.solution.sources[0].content
    ev = guard.evaluate(proposal.solution)
    result = _candidate_result(ev, "c2")
    assert result.passed, [(r.status, r.log[:500]) for r in result.per_workload]
    conclusion = tuner.observe(result)
    assert conclusion.claim.startswith("num_warps 4->8 on seed's c1: ")
    assert set(conclusion.effect) == {"small: batch_size<=3", "large: batch_size>3"}
    assert conclusion.outcome in ("improved", "no_gain", "regressed")


# ------------------------------------------------------------------------------ orchestrator


def test_seed_then_tuner_through_the_orchestrator(
    small_problem: Path, guard: Guard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tuner waits, takes the seed's Triton incumbent from the board and tunes it twice.
    On the CPU ``num_warps`` changes nothing, so which of two equal candidates reads faster
    is noise (each full stage re-times the reference there): a gain threshold no noise
    reaches keeps the tuner on the seed's base instead of its own first candidate."""
    from kernelarc.proposers import tuner as tuner_module

    monkeypatch.setattr(tuner_module, "MIN_GAIN", 10.0)
    problem = load_problem(small_problem)
    tuner, seed = TunerAgent(), SeedAgent([triton_solution(RMS_ROWS)])
    config = run_config(problem, ["tuner", "seed"], budget=3).model_copy(
        update={"problem": str(small_problem)}
    )
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        summary = Orchestrator(
            problem, [tuner, seed], config, RunDir(tmp_path), store, guard, {}
        ).run()
    finally:
        store.close()
    cands, _, conclusions, events = read_store(tmp_path / "store.sqlite")
    info = json.dumps(summary, default=str)[:3000]
    mine = [c for c in cands if c.agent in ("tuner", "seed")]
    assert [c.agent for c in mine] == ["seed", "tuner", "tuner"], info
    seed_id = mine[0].id
    promoted = [e.payload["candidate"] for e in events if e.kind == "incumbent"]
    assert seed_id in promoted, info
    assert mine[1].parent_id == seed_id, "the tuner took the seed's incumbent from the board"
    assert "seed's Triton candidate" in mine[1].hypothesis
    assert any(e.kind == "agent_waiting" and e.payload["agent"] == "tuner" for e in events)
    tuned = [c for c in conclusions if c.agent == "tuner"]
    assert len(tuned) == 2 and all(f"on seed's {seed_id}" in c.claim for c in tuned), tuned


# ------------------------------------------------------------------------------ CLI


def _kernelarc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KERNELARC), *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _seed_then_tuner_cli(small_problem: Path, tmp_path: Path) -> tuple[Any, Any, Path]:
    """``kernelarc optimize --agents tuner --seed-solution`` (budget 3), then the same run
    resumed without its seed; the run directory."""
    seed_file = tmp_path / "seed" / "solution.json"
    seed_file.parent.mkdir()
    seed_file.write_text(triton_solution(RMS_ROWS).model_dump_json(indent=2))
    run_dir = tmp_path / "run"
    proc = _kernelarc(
        "optimize", str(small_problem), "--agents", "tuner", "--seed-solution", str(seed_file),
        "--budget", "3", "--device", "cpu", "--run-dir", str(run_dir), "--json",
        "--full-iterations", "3", "--full-warmup", "1", "--timeout", "120",
        cwd=tmp_path,
    )  # fmt: skip
    again = _kernelarc(
        "optimize", str(small_problem), "--agents", "tuner", "--device", "cpu",
        "--run-dir", str(run_dir), "--resume", cwd=tmp_path,
    )  # fmt: skip
    return proc, again, run_dir


@pytest.fixture(scope="module", autouse=True)
def cli_run(
    request: pytest.FixtureRequest, small_problem: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """The CLI run (its own processes and run directory), started with this module's first
    test (``_shared``'s ``started_ahead``) while the rest run: its test checks counts and
    links of candidates, no timing."""
    name = "test_cli_seed_solution_with_the_tuner"
    jobs = {name: partial(_seed_then_tuner_cli, small_problem, tmp_path_factory.mktemp("cli"))}
    yield from started_ahead(request, jobs)


def test_cli_seed_solution_with_the_tuner(cli_run: dict[str, Future[Any]]) -> None:
    proc, again, run_dir = cli_run["test_cli_seed_solution_with_the_tuner"].result()
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    agents = {a["name"]: a for a in summary["agents"]}
    assert set(agents) >= {"tuner", "seed"}, summary
    assert agents["seed"]["candidates"] == 1 and agents["tuner"]["candidates"] == 2, summary
    assert summary["evaluated"] == 3 and summary["best"], summary
    cands, _, _, _ = read_store(run_dir / "store.sqlite")
    seed_id = next(c.id for c in cands if c.agent == "seed")
    assert all(c.parent_id for c in cands if c.agent == "tuner")
    assert next(c for c in cands if c.agent == "tuner").parent_id == seed_id
    assert again.returncode == 2 and "resume it with the same files" in again.stderr


def test_cli_seed_solution_errors(small_problem: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    proc = _kernelarc(
        "optimize", str(small_problem), "--seed-solution", str(missing), "--device", "cpu",
        "--run-dir", str(tmp_path / "r1"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "--seed-solution" in proc.stderr and "nope.json" in proc.stderr
    assert not (tmp_path / "r1").exists(), "no run directory for a bad seed"
    other = tmp_path / "other.json"
    data = triton_solution(RMS_ROWS).model_dump(mode="json")
    other.write_text(json.dumps({**data, "definition": "gemm_small"}))
    proc = _kernelarc(
        "optimize", str(small_problem), "--seed-solution", str(other), "--device", "cpu",
        "--run-dir", str(tmp_path / "r2"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "other.json" in proc.stderr and "'gemm_small'" in proc.stderr, proc.stderr
    assert "'ka_rmsnorm_h512'" in proc.stderr
