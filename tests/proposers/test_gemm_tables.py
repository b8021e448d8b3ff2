"""The gemm-tables agent (TunableOp tables shipped inside a solution) and its subprocess.

Covered on the CPU: parsing, checking and writing TunableOp's CSV format; the generated
solution (base sources + table + wrapper) validates, builds with the real builder, imports
and computes what the base computes with TunableOp explicitly off, and passes the real guard
(the wrapper reads its table beside itself under the sentinel); the tuning subprocess for
real: a base that hangs is killed at the time limit and when the process that started it
exits (its thread cut off), a base that fails at import and a
machine without CUDA give clear failures carrying stderr; a partial table after a timeout
is shipped and said so in the conclusion; conclusions on constructed verdicts; the agent
passes the shipped conformance checks and proposes nothing without CUDA; state round trip
and refusal of bad state.

On CUDA only (skipped here): tuning the bundled fp32 GEMM example end to end and judging
the proposal with the guard; the tuning's memory cap (a workload over it fails to tune).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kernelarc.agents.conformance import check_agent, make_context, make_result
from kernelarc.agents.types import AgentContext
from kernelarc.examples import example_dir
from kernelarc.guard.build import choose_builder, load_entry
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.guard.static_scan import static_scan
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.reference import make_solution
from kernelarc.problem.schema import Solution
from kernelarc.proposers.gemm_tables import (
    TABLE_FILE,
    WRAPPER_FILE,
    Base,
    GemmTablesAgent,
    TunedOn,
    TuningFailed,
    table_solution,
)
from kernelarc.proposers.tunableop_worker import (
    TableError,
    TuningJob,
    TuningRun,
    parse_table,
    run_tuning,
)

# A table in TunableOp's format as torch writes it on an H200 (CUDA builds validate only
# PT_VERSION; the op names the dtype and transposes, the params the shape and leading dims).
TABLE = """\
Validator,PT_VERSION,2.11.0
GemmTunableOp_float_TN,tn_64_17_128_ld_128_128_64,Gemm_Cublaslt_id_21_tile_20_stages_8_splitk_1_red_0_swizzle_0_custom_0_inner_0_cluster_0,0.004712
GemmTunableOp_float_TN,tn_64_1_128_ld_128_128_64,Default,0.003390
GemmTunableOp_float_TN,tn_64_64_128_ld_128_128_64,Gemm_Cublaslt_id_66_tile_24_stages_16_splitk_2_red_1_swizzle_0_custom_0_inner_0_cluster_0,0.005120
"""
TUNED_ON = TunedOn(torch="2.11.0+cu130", device="NVIDIA H200", capability="9.0")


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("gemm_small"))


def _reference(problem: Problem) -> Solution:
    d = problem.definition
    return make_solution(
        d, agent="test", name=f"{d.name}-ref", description="ref", source=d.reference, entry="run"
    )


def _base(problem: Problem, source: str | None = None) -> Base:
    d = problem.definition
    sol = make_solution(
        d,
        agent="test",
        name=f"{d.name}-base",
        description="base",
        source=source or d.reference,
        entry="run",
    )
    return Base("reference", sol, None, {})


# ---------------------------------------------------------------- the table format


def test_table_parses_and_writes_back_in_tunableop_format() -> None:
    table = parse_table(TABLE)
    assert table.torch_version == "2.11.0" and len(table.entries) == 3
    assert len(table.gemm_entries()) == 3 and len(table.tuned()) == 2
    assert {e.params for e in table.tuned()} == {
        "tn_64_17_128_ld_128_128_64",
        "tn_64_64_128_ld_128_128_64",
    }
    assert parse_table(table.to_csv()) == table
    assert table.to_csv().splitlines()[0] == "Validator,PT_VERSION,2.11.0"
    no_time = parse_table("Validator,PT_VERSION,2.11.0\nGemmTunableOp_Half_NN,nn_8_8_8,Default\n")
    assert no_time.entries[0].time_ms is None and "Default\n" in no_time.to_csv()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("GemmTunableOp_float_NN,nn_1_1_1,Default,0.1\n", "PT_VERSION"),
        ("Validator,PT_VERSION,2.11.0\nGemmTunableOp_float_NN,nn_1_1_1\n", "at least 3"),
        ("Validator,PT_VERSION,2.11.0\nValidator,PT_VERSION,2.10.0\n", "given twice"),
        ("Validator,PT_VERSION,2\nG,nn_1,Default,0.1\nG,nn_1,Gemm_Cublaslt_x,0.2\n", "twice"),
        ("Validator,PT_VERSION,2\nG,nn_1,Default,fast\n", "not a number"),
    ],
)
def test_bad_tables_are_refused(text: str, why: str) -> None:
    with pytest.raises(TableError, match=why):
        parse_table(text)


# ---------------------------------------------------------------- the solution


def test_solution_builds_imports_and_runs_on_the_cpu(problem: Problem, tmp_path: Path) -> None:
    base = _reference(problem)
    sol = table_solution(base, parse_table(TABLE), TUNED_ON, agent="gemm-tables", name="t-1")
    again = Solution.model_validate(sol.model_dump(mode="json"))
    assert again == sol and sol.definition == problem.definition.name
    assert [s.path for s in sol.sources] == ["solution.py", TABLE_FILE, WRAPPER_FILE]
    assert sol.spec.entry_point == f"{WRAPPER_FILE}::kernelarc_entry"
    assert sol.spec.destination_passing_style is False and sol.author == "kernelarc:gemm-tables"
    assert parse_table(sol.sources[1].content) == parse_table(TABLE)
    assert static_scan({s.path: s.content for s in sol.sources}) == []
    art = choose_builder(sol).build(
        sol, work_dir=tmp_path / "w", cache_dir=tmp_path / "c", timeout=60
    )
    entry = load_entry(art)
    module = __import__("sys").modules[art.module_name]
    if not torch.cuda.is_available():
        assert module.TABLE_STATUS == "off: no CUDA device"
        assert (
            not hasattr(torch._C, "_cuda_tunableop_is_enabled")
            or not torch.cuda.tunable.is_enabled()
        )
    a, b = torch.randn(17, 128), torch.randn(64, 128)
    torch.testing.assert_close(entry(a, b), a @ b.T)
    with pytest.raises(ValueError, match="already has"):
        table_solution(sol, parse_table(TABLE), TUNED_ON, agent="gemm-tables", name="t-2")


def test_empty_table_is_reported_and_missing_table_fails_import(
    problem: Problem, tmp_path: Path
) -> None:
    empty = parse_table("Validator,PT_VERSION,2.11.0\n")
    sol = table_solution(_reference(problem), empty, TUNED_ON, agent="gemm-tables", name="e")
    art = choose_builder(sol).build(
        sol, work_dir=tmp_path / "w", cache_dir=tmp_path / "c", timeout=60
    )
    load_entry(art)
    assert (
        __import__("sys").modules[art.module_name].TABLE_STATUS == "off: the table has no entries"
    )
    data = sol.model_dump(mode="json")
    data["sources"] = [s for s in data["sources"] if s["path"] != TABLE_FILE]
    data["name"] = "missing-table"
    broken = Solution.model_validate(data)
    art2 = choose_builder(broken).build(
        broken, work_dir=tmp_path / "w2", cache_dir=tmp_path / "c2", timeout=60
    )
    with pytest.raises(Exception, match="FileNotFoundError"):
        load_entry(art2)


def test_wrapped_solution_passes_the_real_guard(problem: Problem, tmp_path: Path) -> None:
    sol = table_solution(
        _reference(problem), parse_table(TABLE), TUNED_ON, agent="gemm-tables", name="g"
    )
    config = GuardConfig(device="cpu", warmup=1, iterations=3, timeout=300, cache_dir=tmp_path)
    with Guard(problem, config) as guard:
        ev = guard.evaluate(sol, list(problem.workloads[:2]), rounds=2)
    statuses = [(o.status.value, o.check, o.log[:400]) for o in ev.outcomes]
    assert [s[0] for s in statuses] == ["PASSED", "PASSED"], statuses


# ---------------------------------------------------------------- the subprocess


def _job(problem: Problem, work: Path, base: Solution) -> TuningJob:
    return TuningJob(
        definition=problem.definition,
        workloads=list(problem.workloads[:2]),
        solution=base,
        device="cuda",
        build_dir=str(work / "build"),
        table_path=str(work / "table.csv"),
        live_path=str(work / "live.csv"),
    )


def _context(problem: Problem, agent: GemmTablesAgent, **kw: object) -> AgentContext:
    return make_context(problem, "cuda", agent, **kw)


def test_hanging_base_is_killed_at_the_time_limit(problem: Problem, tmp_path: Path) -> None:
    source = "import time\ntime.sleep(600)\n\n\n" + problem.definition.reference
    base = _base(problem, source)
    run = run_tuning(_job(problem, tmp_path, base.solution), tmp_path, timeout_s=6)
    assert run.timed_out and run.table_text is None and not run.partial
    with pytest.raises(ProcessLookupError):
        os.kill(run.pid, 0)
    failure = run.failure()
    assert failure is not None and "ran past its 6 s limit and was killed" in failure
    agent = GemmTablesAgent()
    with pytest.raises(TuningFailed, match="gemm-tables on reference: no table; .*ran past"):
        agent.proposal_from_run(_context(problem, agent), base, run)


def _tuning_workers(job_path: Path) -> list[int]:
    """Pids of live tuning subprocesses started on ``job_path``."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(job_path).encode() in cmd and proc.name.isdigit():
            out.append(int(proc.name))
    return out


def test_the_tuning_ends_with_the_process_that_started_it(problem: Problem, tmp_path: Path) -> None:
    """The orchestrator's proposal threads are daemons, cut off at interpreter exit: the
    tuning (a process session of its own) is killed then, not left running on the GPU."""
    source = "import time\ntime.sleep(600)\n\n\n" + problem.definition.reference
    job = _job(problem, tmp_path, _base(problem, source).solution)
    spec = tmp_path / "spec.json"
    spec.write_text(job.model_dump_json())
    script = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from kernelarc.proposers.tunableop_worker import TuningJob, run_tuning\n"
        "job = TuningJob.model_validate_json(Path(sys.argv[1]).read_text())\n"
        "work = Path(sys.argv[2])\n"
        "threading.Thread(target=run_tuning, args=(job, work, 600), daemon=True).start()\n"
        "deadline = time.monotonic() + 60\n"
        "while not (work / 'job.json').exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
        "time.sleep(2)\n"
        "print('leaving')\n"
    )
    work = tmp_path / "work"
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(spec), str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _tuning_workers(work / "job.json") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _tuning_workers(work / "job.json"), "the tuning subprocess never started"
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0 and "leaving" in out, err
    deadline = time.monotonic() + 10
    while _tuning_workers(work / "job.json") and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _tuning_workers(work / "job.json")
    for pid in left:  # do not leave it to this test run either
        os.kill(pid, 9)
    assert not left, f"tuning subprocess(es) {left} outlived the process that started them"


def test_the_tuning_time_is_capped_by_the_time_left_to_the_search(problem: Problem) -> None:
    agent = GemmTablesAgent(problem, timeout_s=300)
    assert agent.tuning_timeout(_context(problem, agent)) == 300
    assert agent.tuning_timeout(_context(problem, agent, time_left_s=42.0)) == 42.0
    assert agent.tuning_timeout(_context(problem, agent, time_left_s=900.0)) == 300


def test_base_failing_at_import_gives_its_stderr(problem: Problem, tmp_path: Path) -> None:
    source = 'raise RuntimeError("base import exploded")\n' + problem.definition.reference
    base = _base(problem, source)
    run = run_tuning(_job(problem, tmp_path, base.solution), tmp_path, timeout_s=120)
    assert not run.timed_out and run.returncode == 2
    assert "base import exploded" in run.stderr
    agent = GemmTablesAgent()
    with pytest.raises(TuningFailed, match="exited with code 2") as info:
        agent.proposal_from_run(_context(problem, agent), base, run)
    assert "base import exploded" in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_no_cuda_is_a_clear_failure(problem: Problem, tmp_path: Path) -> None:
    run = run_tuning(_job(problem, tmp_path, _reference(problem)), tmp_path, timeout_s=120)
    assert run.returncode == 3 and "cannot tune: no CUDA device" in run.stderr, run.stderr


def test_partial_table_is_shipped_and_concluded(problem: Problem) -> None:
    agent = GemmTablesAgent()
    run = TuningRun(
        pid=0,
        returncode=-9,
        timed_out=True,
        seconds=300,
        events=({"event": "device", **TUNED_ON.model_dump(), "name": TUNED_ON.device},),
        stderr="",
        table_text=TABLE,
        partial=True,
    )
    proposal = agent.proposal_from_run(_context(problem, agent), _base(problem), run)
    assert proposal is not None and proposal.mode == "refine" and proposal.parent_id is None
    assert "3 GEMM shapes" in proposal.hypothesis and "2 chose a non-default" in proposal.hypothesis
    result = make_result(problem, agent, proposal, "improved", "c0007-gemm-tables")
    c = agent.observe(result)
    assert c.outcome == "improved" and c.agent == "gemm-tables" and len(c.claim) <= 300
    assert c.claim.startswith("TunableOp table for the reference: 3 GEMM shapes tuned, 2 non")
    assert "4.00x over eager on 4/4 workloads" in c.claim
    assert "partial table: the tuning subprocess ran past its 300 s limit" in c.claim
    failed = agent.proposal_from_run(_context(problem, agent, must_draft=True), _base(problem), run)
    assert failed is not None and failed.mode == "draft" and failed.parent_id == "c0002-conformance"
    bad = agent.observe(make_result(problem, agent, failed, "failed", "c0008-gemm-tables"))
    assert bad.outcome == "failed" and "failed on 1/4 workloads (RUNTIME_ERROR" in bad.claim


def test_clean_run_without_gemms_proposes_nothing(problem: Problem) -> None:
    agent = GemmTablesAgent()
    run = TuningRun(0, 0, False, 3.0, ({"event": "done", "errors": []},), "", TABLE[:27], False)
    assert agent.proposal_from_run(_context(problem, agent), _base(problem), run) is None


# ---------------------------------------------------------------- the agent


def test_agent_conforms_and_proposes_nothing_without_cuda(problem: Problem) -> None:
    check_agent(GemmTablesAgent, problem, "cpu")
    agent = GemmTablesAgent()
    assert agent.propose(make_context(problem, "cpu", agent)) is None
    if not torch.cuda.is_available():
        assert agent.propose(_context(problem, agent)) is None
    assert agent.state()["tried"] == []


def test_bases_reference_first_then_pytorch_board_incumbents(problem: Problem) -> None:
    agent = GemmTablesAgent()
    ctx = _context(problem, agent)
    bases = agent._bases(ctx)
    assert [b.label for b in bases] == [
        "reference",
        "incumbent c0002-conformance of conformance-other",
    ]
    assert (
        bases[1].baseline_ms
        and agent._next_base(_context(problem, agent, must_draft=True)) == bases[1]
    )


def test_state_round_trip_and_bad_state(problem: Problem) -> None:
    agent = GemmTablesAgent()
    run = TuningRun(
        0,
        0,
        False,
        3.0,
        ({"event": "device", **TUNED_ON.model_dump(), "name": "X"},),
        "",
        TABLE,
        False,
    )
    agent._tried.append("abc")
    assert agent.proposal_from_run(_context(problem, agent), _base(problem), run) is not None
    saved = json.loads(json.dumps(agent.state()))
    twin = GemmTablesAgent()
    twin.restore(saved)
    assert twin.state() == agent.state() and saved["pending"]["shapes"] == 3
    for bad in (
        {"tried": "abc"},
        {"count": -1},
        {"count": True},
        {"pending": {"base": "reference"}},
        {"baseline_ms": {"w": "fast"}},
        {"classes": {"axis": 3}},
    ):
        with pytest.raises(ValueError, match="gemm-tables state"):
            GemmTablesAgent().restore(saved | bad)


# ---------------------------------------------------------------- CUDA end to end


@pytest.mark.gpu
def test_tunes_and_passes_the_guard_on_cuda(problem: Problem, tmp_path: Path) -> None:
    agent = GemmTablesAgent(problem, timeout_s=300)
    proposal = agent.propose(make_context(problem, "cuda", agent))
    assert proposal is not None, "a GEMM problem must give a table"
    table = parse_table(next(s.content for s in proposal.solution.sources if s.path == TABLE_FILE))
    assert len(table.gemm_entries()) >= 1
    config = GuardConfig(device="cuda", warmup=2, iterations=10, timeout=300, cache_dir=tmp_path)
    with Guard(problem, config) as guard:
        ev = guard.evaluate(proposal.solution, rounds=2)
    statuses = [(o.status.value, o.check, o.log[:400]) for o in ev.outcomes]
    assert all(s[0] == "PASSED" for s in statuses), statuses


def test_the_tuning_job_caps_its_memory_at_a_share_of_the_device(
    problem: Problem, tmp_path: Path
) -> None:
    from pydantic import ValidationError

    from kernelarc.proposers.tunableop_worker import TUNING_MEMORY_SHARE

    job = _job(problem, tmp_path, _reference(problem))
    assert job.memory_fraction == TUNING_MEMORY_SHARE and 0 < TUNING_MEMORY_SHARE <= 0.5
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValidationError, match="memory_fraction"):
            TuningJob.model_validate({**job.model_dump(), "memory_fraction": bad})


#: A base that holds 30% of the device's memory while it runs, then runs the reference.
HOG = """

_ka_reference_run = run


def run(*args):
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    hog = torch.empty(int(0.3 * total), dtype=torch.uint8, device="cuda")
    out = _ka_reference_run(*args)
    del hog
    return out
"""


@pytest.mark.gpu
def test_a_workload_over_the_memory_cap_fails_to_tune_and_the_rest_go_on(
    problem: Problem, tmp_path: Path
) -> None:
    """Capped at 25%, the hog's 30% fails on every workload (an allocation error in the
    tuning, not a judged candidate's); at 50% the same base tunes."""
    base = _base(problem, problem.definition.reference + HOG).solution
    capped = run_tuning(_job(problem, tmp_path / "a", base), tmp_path / "a", timeout_s=300)
    device = next((e for e in capped.events if e["event"] == "device"), None)
    assert device is not None, (capped.returncode, capped.stderr[-3000:])
    total = torch.cuda.get_device_properties(0).total_memory
    assert abs(device["memory_cap_bytes"] - 0.25 * total) < 1 << 20, device
    done = next(e for e in capped.events if e["event"] == "done")
    assert len(done["errors"]) == 2 and all("OutOfMemoryError" in e for e in done["errors"])
    assert capped.returncode == 4, capped.stderr[-2000:]
    job = _job(problem, tmp_path / "b", base).model_copy(update={"memory_fraction": 0.5})
    roomy = run_tuning(job, tmp_path / "b", timeout_s=300)
    assert roomy.returncode == 0, roomy.stderr[-2000:]
    ok = [e["ok"] for e in roomy.events if e["event"] == "workload"]
    assert ok == [True, True]


def test_no_tuning_beside_the_guard_when_the_inputs_crowd_the_device() -> None:
    from kernelarc.problem.loader import load_problem
    from kernelarc.proposers.gemm_tables import fits_beside_guard

    problem = load_problem(example_dir("gemm_small"))
    d, wls = problem.definition, problem.workloads
    assert fits_beside_guard(d, wls, 140 << 30) is None
    why = fits_beside_guard(d, wls, 1 << 10)
    assert why is not None and "guard's two workers" in why and "GiB" in why
