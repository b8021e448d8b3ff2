"""``kernelarc eval`` as a user runs it: the real CLI in a real subprocess, on the bundled
example problem ``rmsnorm_h512`` (CPU, workloads 0 and 1, 1 warm-up and 3 timed calls).

Covered here: exit codes (0 all passed, 1 any failure, 2 bad usage with a one-line error and
no traceback), ``-o traces.jsonl`` with one schema-valid trace per selected workload for
PASSED, INCORRECT_NUMERICAL, COMPILE_ERROR and REWARD_HACK (correctness / performance
present exactly as the status demands, workload uuids, ``REWARD_HACK[`` log prefix, the
isolation level in every log), ``--json`` printing only trace lines on stdout, determinism of
statuses and error figures across two runs, ``--help`` listing the README's options, a
solution of another problem refused (exit 2) unless ``--force``, workload ids in the table
that name one workload each, and ``-o`` keeping the traces judged before the command was
killed.
RUNTIME_ERROR and TIMEOUT traces, crashes, leftover processes, secrets, the network and the
Python API are in ``test_guard_isolation.py``.

Not covered: GPU timing, the roofline columns of the table, ``--compile-baseline`` runs.
Solution sources live in ``tests/data/``; each test wraps one in a ``solution.json`` in a
temporary folder. The runs that judge a solution start together, in a module-scoped
fixture; the tests (and the fixtures runs shared by several tests) wait for theirs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import check_trace_lines, started_ahead, write_solution

from kernelarc.cli.eval_cmd import short_ids
from kernelarc.env import parent_environment
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Trace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
DATA = Path(__file__).resolve().parents[1] / "data"
FAST = ("--device", "cpu", "--workloads", "0,1", "--warmup", "1", "--iterations", "3")
UUIDS = [w.uuid for w in load_problem(EXAMPLE).workloads[:2]]


# ---------------------------------------------------------------- helpers


@dataclass
class CliRun:
    rc: int
    stdout: str
    stderr: str
    trace_lines: list[str]  # the lines of the -o file (empty without -o)

    def describe(self) -> str:
        return f"rc={self.rc}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without terminal-size hints (rich then uses 80 columns, as
    in any pipe), plus ``extra``."""
    env = {k: v for k, v in parent_environment().items() if k not in ("COLUMNS", "LINES")}
    env.update(extra or {})
    return env


def run_eval(
    args: list[str],
    *,
    cwd: Path | None = None,
    out: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> CliRun:
    cmd = [sys.executable, "-m", "kernelarc.cli.main", "eval", *args]
    if out is not None:
        cmd += ["-o", str(out)]
    p = subprocess.run(
        cmd, cwd=cwd or ROOT, env=env or cli_env(), capture_output=True, text=True, timeout=timeout
    )
    lines = out.read_text().splitlines() if out is not None and out.exists() else []
    return CliRun(p.returncode, p.stdout, p.stderr, lines)


def check_traces(run: CliRun, lines: list[str], statuses: list[str]) -> list[Trace]:
    """Parse trace lines and check them against the expected status per workload."""
    return check_trace_lines(lines, UUIDS, statuses, run.describe())


# ---------------------------------------------------------------- all passed, --json


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Any]]]:
    """The CLI runs of this module that judge a solution, each in a folder of its own, started
    together (``_shared``'s ``started_ahead``), by the fixture or test that checks them:
    nothing they are checked for is a timing. The longest (two runs) first."""
    tmp = tmp_path_factory.mktemp
    example = [str(EXAMPLE), "--solution", str(EXAMPLE / "solution_pytorch.json"), *FAST]
    numerics = (DATA / "numerics_split.py").read_text()
    markup = write_solution(tmp("markup") / "sol", MARKUP, "markup")
    jobs: dict[str, Callable[[], Any]] = {
        "numerics": partial(_run_twice, [tmp("numerics0"), tmp("numerics1")], numerics),
        "passed": partial(run_eval, [*example, "--json"], out=tmp("passed") / "traces.jsonl"),
        "test_syntax_error_is_compile_error_with_file_and_line": partial(
            _run_source, tmp("syntax"), SYNTAX_ERROR, "syntax_error"
        ),
        "timer_patch": partial(
            _run_source, tmp("timer"), (DATA / "timer_patch.py").read_text(), "timer_patch"
        ),
        "test_force_judges_a_solution_of_another_problem": partial(_run_forced, tmp("forced")),
        "test_markup_in_a_candidate_error_does_not_crash_the_cli": partial(
            run_eval,
            [str(EXAMPLE), "--solution", str(markup), *FAST[:2], "--workloads", "0"]
            + ["--rounds", "1"],
        ),
    }
    yield from started_ahead(request, jobs)


@pytest.fixture(scope="module")
def passed(runs: dict[str, Future[Any]]) -> CliRun:
    result: CliRun = runs["passed"].result()
    return result


def test_all_passed_exits_0_with_a_trace_per_workload(passed: CliRun) -> None:
    assert passed.rc == 0, passed.describe()
    traces = check_traces(passed, passed.trace_lines, ["PASSED", "PASSED"])
    assert all(t.solution == "ka_rmsnorm_h512_pytorch" for t in traces)
    assert "Traceback" not in passed.stderr


def test_json_prints_only_trace_lines(passed: CliRun) -> None:
    lines = passed.stdout.splitlines()
    assert passed.stdout.endswith("\n"), passed.describe()
    check_traces(passed, lines, ["PASSED", "PASSED"])
    assert lines == passed.trace_lines  # stdout and the -o file carry the same traces


# ---------------------------------------------------------------- bad usage


def _usage_case(tmp: Path, case: str) -> tuple[list[str], list[str]]:
    """Arguments (run in ``tmp``) and fragments the error must contain."""
    example_sol = str(EXAMPLE / "solution_pytorch.json")
    if case == "missing-problem":
        return ["no_such_problem", "--solution", example_sol], ["no_such_problem", "does not exist"]
    if case == "missing-solution":
        return [str(EXAMPLE), "--solution", "missing.json"], ["missing.json", "does not exist"]
    if case == "invalid-json":
        (tmp / "bad.json").write_text('{\n  "name": "x",\n  "definition": "d",\n  oops\n}\n')
        return [str(EXAMPLE), "--solution", "bad.json"], ["bad.json:4", "invalid JSON", "line 4"]
    assert case == "missing-source"
    sol = write_solution(tmp / "sol", "def run(a, b, c):\n    pass\n", "no_source")
    (tmp / "sol" / "s.py").unlink()
    return [str(EXAMPLE), "--solution", str(sol)], ["solution.json", "'s.py'", "does not exist"]


USAGE_CASES = ["missing-problem", "missing-solution", "invalid-json", "missing-source"]


@pytest.mark.parametrize("case", USAGE_CASES)
def test_bad_usage_exits_2_with_a_clear_error(tmp_path: Path, case: str) -> None:
    args, fragments = _usage_case(tmp_path, case)
    run = run_eval([*args, *FAST], cwd=tmp_path)
    assert run.rc == 2, run.describe()
    assert "Traceback" not in run.stderr and run.stdout == "", run.describe()
    text = " ".join(run.stderr.split())
    assert text.startswith("error: "), run.describe()
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} missing\n{run.describe()}"


def test_short_usage_error_is_one_line(tmp_path: Path) -> None:
    args, _ = _usage_case(tmp_path, "missing-solution")
    run = run_eval([*args, *FAST], cwd=tmp_path)
    assert run.rc == 2
    assert run.stderr.strip() == "error: missing.json: file does not exist", run.describe()


@pytest.mark.parametrize("case", ["missing-problem", "invalid-json", "missing-source"])
def test_long_usage_error_is_one_line(tmp_path: Path, case: str) -> None:
    args, fragments = _usage_case(tmp_path, case)
    run = run_eval([*args, *FAST], cwd=tmp_path)
    assert run.rc == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.describe()
    assert all(f in lines[0] for f in fragments), run.describe()


def test_missing_solution_option_exits_2(tmp_path: Path) -> None:
    run = run_eval([str(EXAMPLE), "--device", "cpu"], cwd=tmp_path)
    assert run.rc == 2, run.describe()
    assert "--solution" in run.stderr and "Traceback" not in run.stderr, run.describe()


# ---------------------------------------------------------------- statuses in -o


def _run_source(tmp: Path, source: str, name: str, *extra: str) -> CliRun:
    sol = write_solution(tmp / "sol", source, name)
    return run_eval([str(EXAMPLE), "--solution", str(sol), *FAST, *extra], out=tmp / "traces.jsonl")


def _run_twice(tmps: list[Path], source: str) -> list[CliRun]:
    """numerics_split.py's ``source`` judged twice (two separate CLI runs)."""
    return [_run_source(tmp, source, "numerics_split") for tmp in tmps]


SYNTAX_ERROR = "import torch\n\ndef run(hidden_states, weight, output)\n    pass\n"
MARKUP = "def run(hidden_states, weight, output):\n    raise RuntimeError('bad [/x] tag')\n"


def test_syntax_error_is_compile_error_with_file_and_line(runs: dict[str, Future[Any]]) -> None:
    run = runs["test_syntax_error_is_compile_error_with_file_and_line"].result()
    assert run.rc == 1, run.describe()
    for trace in check_traces(run, run.trace_lines, ["COMPILE_ERROR", "COMPILE_ERROR"]):
        assert trace.evaluation is not None and "s.py:3" in trace.evaluation.log


@pytest.fixture(scope="module")
def timer_patch(runs: dict[str, Future[Any]]) -> CliRun:
    result: CliRun = runs["timer_patch"].result()
    return result


def test_timer_patch_is_reward_hack(timer_patch: CliRun) -> None:
    assert timer_patch.rc == 1, timer_patch.describe()
    traces = check_traces(timer_patch, timer_patch.trace_lines, ["REWARD_HACK"] * 2)
    for trace in traces:
        assert trace.evaluation is not None
        assert trace.evaluation.log.startswith("REWARD_HACK[timer-patch]: "), trace
        assert "perf_counter" in trace.evaluation.log


def test_table_names_the_check_that_fired(timer_patch: CliRun) -> None:
    assert "REWARD_HACK[timer-patch]" in timer_patch.stdout, timer_patch.describe()


def test_markup_in_a_candidate_error_does_not_crash_the_cli(runs: dict[str, Future[Any]]) -> None:
    run = runs["test_markup_in_a_candidate_error_does_not_crash_the_cli"].result()
    assert run.rc == 1 and "Traceback" not in run.stderr, run.describe()
    assert "bad [/x] tag" in run.stdout, run.describe()


# ---------------------------------------------------------------- another problem's solution


def _other_problems_solution(folder: Path) -> Path:
    """The example's own PyTorch solution, saying it is for another problem."""
    sol = json.loads((EXAMPLE / "solution_pytorch.json").read_text())
    sol["definition"] = "some_other_problem"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "solution.json").write_text(json.dumps(sol))
    return folder / "solution.json"


def test_a_solution_of_another_problem_is_refused(tmp_path: Path) -> None:
    sol = _other_problems_solution(tmp_path)
    run = run_eval([str(EXAMPLE), "--solution", str(sol), *FAST], cwd=tmp_path)
    assert run.rc == 2 and run.stdout == "", run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.describe()
    for fragment in ("'some_other_problem'", "'ka_rmsnorm_h512'", "--force"):
        assert fragment in lines[0], run.describe()


def _run_forced(tmp: Path) -> CliRun:
    sol = _other_problems_solution(tmp)
    return run_eval(
        [str(EXAMPLE), "--solution", str(sol), *FAST[:2], "--workloads", "0", "--force"]
        + ["--rounds", "1", "--warmup", "1", "--iterations", "3"]
    )


def test_force_judges_a_solution_of_another_problem(runs: dict[str, Future[Any]]) -> None:
    run = runs["test_force_judges_a_solution_of_another_problem"].result()
    assert run.rc == 0, run.describe()
    assert "warning:" in run.stderr and "'some_other_problem'" in run.stderr, run.describe()


# ---------------------------------------------------------------- workload ids


def test_short_ids_are_unique_prefixes_of_at_least_8_characters() -> None:
    uuids = [w.uuid for w in load_problem(EXAMPLE).workloads]
    ids = short_ids(uuids)
    assert len(set(ids.values())) == len(uuids)
    for uuid, wid in ids.items():
        assert len(wid) >= 8 and uuid.startswith(wid)
        assert [u for u in uuids if u.startswith(wid)] == [uuid]
    assert ids["ka-rms512-b0001-5d0c1f3e"] == "ka-rms512-b0001"
    # short uuids are printed whole; a uuid that begins another is printed whole, and the
    # other one character further
    assert short_ids(["abc", "abd"]) == {"abc": "abc", "abd": "abd"}
    assert short_ids(["abcdefgh", "abcdefghij"]) == {
        "abcdefgh": "abcdefgh",
        "abcdefghij": "abcdefghi",
    }
    # an all-digit prefix would read as an index: longer
    assert short_ids(["123456789-a", "223456789-b"])["123456789-a"] == "123456789-"


def test_the_table_names_each_workload_by_a_unique_id(numerics: list[CliRun]) -> None:
    text = numerics[0].stdout
    for uuid in UUIDS:
        assert f" {uuid[:15]} " in text, numerics[0].describe()
    assert UUIDS[0][:15] != UUIDS[1][:15]


# ---------------------------------------------------------------- -o as the run goes


def test_traces_are_written_as_judged_and_kept_when_the_command_is_killed(
    tmp_path: Path,
) -> None:
    """Workload 1 passes, then workload 0 hangs (``hang_first.py``, limit 300 s): its trace
    is in the -o file while the command still runs, and stays there after a SIGKILL."""
    sol = write_solution(tmp_path / "sol", (DATA / "hang_first.py").read_text(), "hang_first")
    out = tmp_path / "traces.jsonl"
    cmd = [sys.executable, "-m", "kernelarc.cli.main", "eval", str(EXAMPLE), "--solution"]
    cmd += [str(sol), *FAST[:2], "--workloads", "1,0", *FAST[4:], "--timeout", "300"]
    cmd += ["-o", str(out)]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().endswith("\n"):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"the command ended (rc {proc.returncode}) before the hang"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    lines = out.read_text().splitlines() if out.exists() else []
    check_trace_lines(lines, [UUIDS[1]], ["PASSED"], f"-o file: {lines}")


# ---------------------------------------------------------------- numerics, determinism


@pytest.fixture(scope="module")
def numerics(runs: dict[str, Future[Any]]) -> list[CliRun]:
    """numerics_split.py judged twice (two separate CLI runs)."""
    result: list[CliRun] = runs["numerics"].result()
    return result


def test_any_failure_exits_1_and_failing_numerics_carry_correctness(numerics: list[CliRun]) -> None:
    run = numerics[0]
    assert run.rc == 1, run.describe()
    bad, good = check_traces(run, run.trace_lines, ["INCORRECT_NUMERICAL", "PASSED"])
    assert bad.evaluation is not None and bad.evaluation.correctness is not None
    # 10 % too large: the relative error is about 0.1 (bf16 rounding aside)
    assert 0.05 < bad.evaluation.correctness.max_relative_error < 0.2, bad.evaluation
    assert good.evaluation is not None and good.evaluation.correctness is not None
    assert 0 < good.evaluation.correctness.max_absolute_error <= 0.1, good.evaluation


def test_same_solution_twice_gives_identical_statuses_and_errors(numerics: list[CliRun]) -> None:
    def figures(run: CliRun) -> list[tuple[str, str, float, float]]:
        out = []
        for trace in check_traces(run, run.trace_lines, ["INCORRECT_NUMERICAL", "PASSED"]):
            ev = trace.evaluation
            assert ev is not None and ev.correctness is not None
            out.append(
                (
                    trace.workload.uuid,
                    ev.status.value,
                    ev.correctness.max_absolute_error,
                    ev.correctness.max_relative_error,
                )
            )
        return out

    first, second = (figures(r) for r in numerics)
    assert first == second
    assert all(f[2] > 0 for f in first)  # non-zero errors: the inputs really are identical


# ---------------------------------------------------------------- --help


README_OPTIONS = (
    "--solution",
    "--device",
    "--timeout",
    "--workloads",
    "-o",
    "--json",
    "--strict-precision",
    "--compile-baseline",
    "--profile",
    "--force",
)


def test_readme_documents_these_options() -> None:
    readme = (ROOT / "README.md").read_text()
    for opt in README_OPTIONS:
        assert f"[{opt}" in readme or f"{opt} " in readme, opt


def _help(columns: str | None) -> str:
    env = cli_env({"COLUMNS": columns} if columns else None)
    p = subprocess.run(
        [sys.executable, "-m", "kernelarc.cli.main", "eval", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_help_lists_every_documented_option_on_a_wide_terminal() -> None:
    text = _help("200")
    for opt in README_OPTIONS:
        assert f" {opt} " in text, f"{opt} not in --help:\n{text}"


def test_help_lists_every_documented_option_at_80_columns() -> None:
    text = _help(None)
    for opt in README_OPTIONS:
        assert f" {opt} " in text, f"{opt} not in --help:\n{text}"
