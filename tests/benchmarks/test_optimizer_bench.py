"""``benchmarks/optimizer_bench.py``: the run on the CPU, and ``--merge``, one table over
the results of split runs.

Covered: two result files merged (a later file's problem replaces an earlier one's, an
unfinished problem is left out with a message), geomeans over the merged rows, and a file
that is not a result file named in the error, the code version each row was run with (and
a warning when they differ); the script run end to end on the CPU (the bundled example, a
search on a subset of its workloads, no baseline session where the search judged the
baseline on all of them), then ``compile_baseline.py`` timing the baseline in a session of
its own, cut by its budget, from the solution the row keeps, and ``--extend`` adding the
workload it did not reach (on the row's card only; each row names its card, and the merge
warns when rows come from different cards); which of the two gives the
every-workload figure; the baseline's order of workloads; SIGTERM stopping the search and
keeping its row; the published result files printed again. Not covered: the benchmark's GPU runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "optimizer_bench.py"


def _summary(problem: str, vs_compile: float, bound: float) -> dict[str, object]:
    return {
        "problem": problem, "correct": "4/4", "vs_eager": 2.0, "vs_compile": vs_compile,
        "compile_n": 1, "frac_bound": bound, "frac_bound_big": bound, "big_n": 4,
        "winner": "compiler", "bound_types": {"compute": 4}, "wall_s": 10.0, "device_s": 9.0,
    }  # fmt: skip


def _identity() -> Any:
    """``benchmarks/code_identity.py`` (the script's code-version helpers) as a module."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import code_identity
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return code_identity


def _run(*files: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--merge", *map(str, files)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_merge_prints_one_table_over_split_runs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"P1": {"summary": _summary("P1", 9.0, 0.9)},
                             "P2": {"summary": _summary("P2", 1.0, 0.1)}}))  # fmt: skip
    b.write_text(json.dumps({"P2": {"summary": _summary("P2", 4.0, 0.4)},
                             "P3": {"optimize": {}}}))  # fmt: skip
    out = _run(a, b)
    assert out.returncode == 0, out.stderr
    assert "P3 has no summary" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("P")]
    assert [r.split()[0] for r in rows] == ["P1", "P2"]
    assert "4.00x" in rows[1], "the later file's P2 replaces the earlier one"
    assert "vs compile 6.00x, bound 60.0%" in out.stdout  # sqrt(9*4), sqrt(0.9*0.4)
    assert "card: unrecorded" in out.stdout, "rows written before rows named their card"


def test_merge_prints_the_geomean_of_each_problems_widest_compile_figure(tmp_path: Path) -> None:
    """The search's figure over every workload where a row has it, else the baseline
    session's sample; a row with neither is left out and counted."""
    searched = {**_summary("P1", 0.0, 0.5), "vs_compile": None, "compile_n": 0}
    searched |= {"vs_compile_search": 3.0, "compile_search_n": 4}
    searched |= {"vs_compile_all": 3.0, "compile_all_from": "search"}
    sampled = {**_summary("P2", 12.0, 0.5), "compile_n": 2, "compile_of": 4}
    neither = {**_summary("P3", 0.0, 0.5), "vs_compile": None, "compile_n": 0}
    f = tmp_path / "a.json"
    f.write_text(json.dumps({k: {"summary": v} for k, v in
                             (("P1", searched), ("P2", sampled), ("P3", neither))}))  # fmt: skip
    out = _run(f)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "each problem's widest figure" in x)
    assert line.endswith("6.00x over 2/3 problems: P1 search 4, P2 baseline 2/4"), line


def test_merge_warns_when_rows_come_from_different_cards(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    rows = {k: {"summary": {**_summary(k, 2.0, 0.2), "gpu": g}}
            for k, g in (("P1", "NVIDIA H200"), ("P2", "NVIDIA H100 80GB HBM3"),
                         ("P3", "NVIDIA H200"))}  # fmt: skip
    a.write_text(json.dumps(rows))
    out = _run(a)
    assert out.returncode == 0, out.stderr
    assert "WARNING: these rows come from different cards" in out.stdout
    assert "NVIDIA H100 80GB HBM3: P2; NVIDIA H200: P1, P3" in out.stdout
    a.write_text(json.dumps({"P1": rows["P1"], "P3": rows["P3"]}))
    same = _run(a)
    assert "card: NVIDIA H200" in same.stdout and "WARNING" not in same.stdout


def test_the_baseline_is_extended_only_on_the_card_of_its_row() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from compile_baseline import check_card
    finally:
        sys.path.remove(str(SCRIPT.parent))
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    check_card({"gpu": h200}, None, h200)
    check_card({}, h200, h200)  # an older row, its card stated
    with pytest.raises(SystemExit, match="timed on 'NVIDIA H200' and this is 'NVIDIA H100"):
        check_card({"gpu": h200}, None, h100)
    with pytest.raises(SystemExit, match="does not name the card .* pass --row-gpu"):
        check_card({}, None, h100)
    with pytest.raises(SystemExit, match="timed on 'NVIDIA H200'"):
        check_card({}, h200, h100)
    with pytest.raises(SystemExit, match="--row-gpu 'NVIDIA H100 80GB HBM3' but the row names"):
        check_card({"gpu": h200}, h100, h200)


def test_merge_names_a_file_it_cannot_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    out = _run(bad)
    assert out.returncode != 0 and f"{bad} is not an agents_bench.json" in out.stderr


def test_merge_says_when_rows_come_from_different_code(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    row = {"summary": _summary("P1", 2.0, 0.2), "code": "abc1234", "code_tree": "t1"}
    a.write_text(json.dumps({"P1": row}))
    b.write_text(json.dumps({"P2": {**row, "summary": _summary("P2", 2.0, 0.2), "code": "e5"}}))
    same = _run(a, b)
    assert same.returncode == 0, same.stderr
    assert "code versions: abc1234, e5\n" in same.stdout, "two commits, one code tree"
    assert "t1\n" in same.stdout and "not come from one" not in same.stdout
    b.write_text(
        json.dumps({"P2": {**row, "summary": _summary("P2", 2.0, 0.2), "code_tree": "t2"}})
    )
    mixed = _run(a, b)
    assert ": t1, t2" in mixed.stdout
    assert "do not come from one known version of the code" in mixed.stdout
    b.write_text(
        json.dumps({"P2": {**row, "summary": _summary("P2", 2.0, 0.2), "code_tree": "t1+dirty"}})
    )
    assert "do not come from one known" in _run(a, b).stdout


def test_merge_judges_rows_by_their_content_hash_where_every_row_has_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    row = {"summary": _summary("P1", 2.0, 0.2), "code": "48ab8fb+dirty",
           "code_tree": "t1+dirty", "code_content": "src:aaa script:bbb"}  # fmt: skip
    a.write_text(json.dumps({"P1": row}))
    b.write_text(json.dumps({"P2": {**row, "summary": _summary("P2", 2.0, 0.2)}}))
    same = _run(a, b)
    assert "code contents: src:aaa script:bbb\n" in same.stdout
    assert "not come from one" not in same.stdout, "a stale .git does not split one code"
    b.write_text(json.dumps({"P2": {**row, "code_content": "src:ccc script:bbb"}}))
    assert "do not come from one known version" in _run(a, b).stdout
    b.write_text(json.dumps({"P2": {k: v for k, v in row.items() if k != "code_content"}}))
    assert "do not come from one known version" in _run(a, b).stdout, "old row: tree rule"


def test_the_content_hash_is_the_one_the_device_calls_print() -> None:
    ids = _identity()
    shell = subprocess.run(
        ["bash", "-c", "find src -name '*.py' | LC_ALL=C sort | xargs cat | sha1sum"],
        cwd=SCRIPT.parents[1], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert ids.code_content().split()[0] == f"src:{shell.stdout[:12]}"


def test_merge_works_out_the_tree_of_a_row_that_has_only_a_commit(tmp_path: Path) -> None:
    root = SCRIPT.parents[1]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    ids = _identity()
    tree = ids.code_tree()
    assert tree is not None and len(tree) == 12
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(
        json.dumps({"P1": {"summary": _summary("P1", 2.0, 0.2), "code": head.stdout.strip()}})
    )
    b.write_text(json.dumps({"P2": {"summary": _summary("P2", 2.0, 0.2), "code": "0000000"}}))
    out = _run(a, b)
    assert tree in out.stdout and "unknown (0000000 not in this checkout)" in out.stdout
    assert "do not come from one known version" in out.stdout


def test_the_benchmark_records_its_commit() -> None:
    ids = _identity()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=SCRIPT.parents[1], capture_output=True,
        text=True,
    )  # fmt: skip
    version = ids.code_version()
    if head.returncode == 0:
        assert version.split("+")[0] == head.stdout.strip()
        assert ids.code_tree_version().split("+")[0] == ids.code_tree()
    else:
        assert version.startswith("unknown") and ids.code_tree_version() == "unknown"


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[None]]]:
    """The two runs of the script on the CPU (end to end; stopped by SIGTERM), each in a
    folder of its own, started together (``_shared``'s ``started_ahead``): each test waits
    for its own, which checks what it saw (no timing: a deadline passed either way, a budget
    cut after the first workload, a stop after the first verdict)."""
    jobs: dict[str, Callable[[], None]] = {
        "test_the_benchmark_runs_end_to_end_on_the_cpu": partial(
            _end_to_end, tmp_path_factory.mktemp("e2e")
        ),
        "test_sigterm_stops_the_search_and_keeps_its_row": partial(
            _stopped_by_sigterm, tmp_path_factory.mktemp("sigterm")
        ),
        "test_sigterm_stops_the_baseline_session_and_keeps_the_row": partial(
            _stopped_in_the_baseline, tmp_path_factory.mktemp("baseline")
        ),
    }
    yield from started_ahead(request, jobs)


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_on_the_cpu(runs: dict[str, Future[None]]) -> None:
    """``_end_to_end``, run by ``runs``."""
    runs["test_the_benchmark_runs_end_to_end_on_the_cpu"].result()


@pytest.mark.slow
def test_sigterm_stops_the_search_and_keeps_its_row(runs: dict[str, Future[None]]) -> None:
    """``_stopped_by_sigterm``, run by ``runs``."""
    runs["test_sigterm_stops_the_search_and_keeps_its_row"].result()


@pytest.mark.slow
def test_sigterm_stops_the_baseline_session_and_keeps_the_row(
    runs: dict[str, Future[None]],
) -> None:
    """``_stopped_in_the_baseline``, run by ``runs``."""
    runs["test_sigterm_stops_the_baseline_session_and_keeps_the_row"].result()


def _end_to_end(tmp_path: Path) -> None:
    """The script itself, as the device calls run it (a dry run on the CPU with the bundled
    example, a search by the compiler agent on 2 of its 6 workloads, its report; no baseline
    session, since the search judged torch.compile's baseline in full on both, which the row
    says although the script's deadline passed during the search too), then
    ``compile_baseline.py`` timing the baseline in a session of its own from the solution the
    row keeps, cut by its budget after the first workload, into a copy of the results: a
    broken script would cost a device call."""
    examples = SCRIPT.parents[1] / "src" / "kernelarc" / "examples"
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--problems", str(examples), "--only", "rmsnorm_h512"]
    cmd += ["--device", "cpu", "--budget", "1", "--agents", "compiler", "--time-limit", "150"]
    cmd += ["--workloads", "0,1", "--out", str(out), "--runs-dir", str(tmp_path / "runs")]
    cmd += ["--deadline", "5"]  # passed during the search: the session is not needed anyway
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    row = json.loads((out / "agents_bench.json").read_text())["rmsnorm_h512"]
    s = row["summary"]
    # the compiler's first proposal is torch.compile's baseline; on the CPU the reference
    # may beat it (the run then hands over the reference: winner "reference-fallback")
    assert s["correct"] == "2/2 of 6" and s["winner"] in ("compiler", "reference-fallback"), s
    found = row["best"]["search_compile"]
    assert found["candidate"] == "c0001-compiler" and found["stage"] == "full", found
    assert s["compile_search_n"] == 2 and s["vs_compile_search"] > 0
    assert s["compile_all_from"] == "search" and s["vs_compile_all"] == s["vs_compile_search"]
    assert row["compile"]["skipped"].startswith("the search judged") and s["compile_skipped"]
    assert s["compile_n"] == 0 and s["vs_compile"] is None
    report = (tmp_path / "runs" / "run-rmsnorm_h512" / "report.md").read_text()
    assert "Against torch.compile's baseline (`torch.compile(run, dynamic=False)`, " in report
    assert len(row["best"]["per_workload"]) == 2 and row["optimize"]["exit"] == 0
    assert row["gpu"] == "cpu" and s["gpu"] == "cpu" and "card: cpu" in p.stdout
    assert sum(row["bound_types"].values()) == 2, row["bound_types"]  # the run's workloads
    kept = json.loads((out / "best-rmsnorm_h512.json").read_text())
    assert row["best"]["solution"] == kept and kept["sources"]
    assert any(line.startswith("rmsnorm_h512 2/2 of 6") for line in p.stdout.splitlines())
    assert "(in search)" in p.stdout and "over 1/1 problems: rmsnorm_h512 search" in p.stdout

    again = tmp_path / "again.json"
    cmd = [sys.executable, str(SCRIPT.parent / "compile_baseline.py")]
    cmd += [str(examples / "rmsnorm_h512")]  # the solution: the one the row keeps
    cmd += ["--device", "cpu", "--workloads", "0,1", "--bench", str(out / "agents_bench.json")]
    cmd += ["--key", "rmsnorm_h512", "--out", str(again), "--budget", "1"]
    q = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert q.returncode == 0, q.stdout[-2000:] + q.stderr[-3000:]
    row2 = json.loads(again.read_text())["rmsnorm_h512"]
    s2, base = row2["summary"], row2["compile"]
    assert s2["compile_n"] == 1 and s2["vs_eager"] and s2["vs_compile"]
    assert base["planned"] == 2 and base["of"] == 2 and base["stopped"].startswith("budget")
    assert base["phases_s"]["reference_timing"] > 0 and base["gpu"] == "cpu"
    assert base["workloads"][0]["compiled_phases_s"]["calls"] > 0
    run_uuids = {w["uuid"] for w in row["best"]["per_workload"]}
    assert [w["uuid"] in run_uuids for w in base["workloads"]] == [True]  # of the run's
    assert row2["best"] == row["best"] and row2["compile_measured"]["code_content"]
    assert s2["compile_all_from"] == "search", "the session covers 1 of 2: the search's stands"
    assert "(1/2)" in _run(again).stdout
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and f"--out {again} exists" in refused.stderr

    # a second session times the workload the first did not reach, and adds it
    more = tmp_path / "more.json"
    cmd = [
        sys.executable,
        str(SCRIPT.parent / "compile_baseline.py"),
        str(examples / "rmsnorm_h512"),
    ]
    cmd += ["--device", "cpu", "--bench", str(again), "--key", "rmsnorm_h512", "--out", str(more)]
    e = subprocess.run([*cmd, "--extend"], capture_output=True, text=True, timeout=400)
    assert e.returncode == 0, e.stdout[-2000:] + e.stderr[-3000:]
    assert "--extend: 1 of 2 workloads to time" in e.stdout
    row3 = json.loads(more.read_text())["rmsnorm_h512"]
    base3 = row3["compile"]
    assert [w["uuid"] for w in base3["workloads"]][:1] == [base["workloads"][0]["uuid"]]
    assert sorted(w["uuid"] for w in base3["workloads"]) == sorted(run_uuids)
    assert base3["of"] == 2 and [x["workloads"] for x in base3["sessions"]] == [1, 1]
    assert [x["gpu"] for x in base3["sessions"]] == ["cpu", "cpu"]
    assert row3["summary"]["compile_n"] == 2 and "(2/2)" in _run(more).stdout
    done = tmp_path / "done.json"
    cmd = [*cmd[:-5], str(more), "--key", "rmsnorm_h512", "--out", str(done), "--extend"]
    f = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert f.returncode != 0 and "covers all 2 workloads already" in f.stderr
    assert not done.exists()


def _sigterm_once(
    cmd: list[str], ready: Callable[[], bool], *, wait_s: float, exit_s: float, early: str
) -> str:
    """Runs ``cmd``, sends it SIGTERM once ``ready()`` (polled), and returns its stdout; it
    must still be running then and exit 0 within ``exit_s``. Killed on any failure."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.1)
        assert proc.poll() is None, early
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=exit_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    return stdout


def _stopped_by_sigterm(tmp_path: Path) -> None:
    """SIGTERM to the script (e.g. from ``timeout``) once the search has judged a
    candidate: the search is told to stop and hands over its best, the row is saved, no
    baseline session and no further problem start (a killed script would lose the row)."""
    examples = SCRIPT.parents[1] / "src" / "kernelarc" / "examples"
    out, runs = tmp_path / "out", tmp_path / "runs"
    cmd = [sys.executable, str(SCRIPT), "--problems", str(examples)]
    cmd += ["--only", "rmsnorm_h512,gemm_small", "--device", "cpu", "--budget", "4"]
    cmd += ["--agents", "reference,compiler", "--time-limit", "300", "--out", str(out)]
    cmd += ["--runs-dir", str(runs)]
    events = runs / "run-rmsnorm_h512" / "events.jsonl"
    stdout = _sigterm_once(
        cmd,
        lambda: events.exists() and '"kind": "evaluated"' in events.read_text(),
        wait_s=240,
        exit_s=240,
        early="the search ended before it could be stopped",
    )
    results = json.loads((out / "agents_bench.json").read_text())
    assert list(results) == ["rmsnorm_h512"] and "gemm_small: not started, SIGTERM" in stdout
    row = results["rmsnorm_h512"]
    assert row["sigterm"] and row["optimize"]["status"]["stopped"] == "interrupted", row
    assert row["optimize"]["exit"] == 0 and row["best"]["per_workload"]
    assert (out / "best-rmsnorm_h512.json").is_file()
    assert row["compile"].get("skipped") or row["compile"]["error"] == "skipped: SIGTERM"


def test_the_every_workload_figure_takes_the_session_only_where_it_covers_the_run() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from bench_table import summarize
    finally:
        sys.path.remove(str(SCRIPT.parent))
    per = [{"uuid": u, "status": "PASSED", "latency_ms": 1.0, "reference_ms": 2.0,
            "bound_ms": 0.5} for u in "ab"]  # fmt: skip
    comp = [{**w, "compiled_ms": 4.0} for w in per]
    row = {"best": {"per_workload": per, "search_compile": None}, "optimize": {"wall_s": 1.0},
           "compile": {"workloads": comp, "of": 2}}  # fmt: skip
    s = summarize("P", row)  # no baseline in the search
    assert s["compile_all_from"] == "session" and s["vs_compile_all"] == pytest.approx(4.0)
    row["compile"]["workloads"] = comp[:1]
    assert summarize("P", row)["vs_compile_all"] is None, "a session over 1 of 2 workloads"
    row["compile"]["workloads"] = comp
    row["best"]["per_workload"] = [per[0], {**per[1], "status": "INCORRECT"}]
    assert summarize("P", row)["vs_compile_all"] is None, "a workload of the run failed"


def test_the_compile_baseline_takes_workloads_spread_over_the_sizes() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from optimizer_bench import spread_order
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert spread_order(0) == [] and spread_order(1) == [0] and spread_order(2) == [1, 0]
    assert spread_order(5) == [2, 0, 4, 1, 3]
    assert spread_order(9)[:5] == [4, 0, 8, 2, 6], "each next one halves the widest gap"
    for n in range(1, 50):
        order = spread_order(n)
        assert sorted(order) == list(range(n)) and order[0] == n // 2
        assert set(order[:3]) == {0, n // 2, n - 1}


def test_the_compile_baseline_refuses_a_row_the_results_do_not_have(tmp_path: Path) -> None:
    bench = tmp_path / "agents_bench.json"
    bench.write_text(json.dumps({"002": {"summary": _summary("002", 1.0, 0.1)}}))
    cmd = [sys.executable, str(SCRIPT.parent / "compile_baseline.py"), "p", "s.json"]
    cmd += ["--bench", str(bench), "--key", "007", "--out", str(tmp_path / "n.json")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "--key 007: not a row of --bench (its rows: 002)" in p.stderr
    assert not (tmp_path / "n.json").exists()


def test_the_published_tables_merge_to_their_figures() -> None:
    """``benchmarks/results/optimizer_*.json`` (the rows of docs/PERFORMANCE.md's tables)
    printed again by ``--merge``: one code, one card, and the geomeans the page quotes."""
    results = SCRIPT.parent / "results"
    expected = {
        "optimizer_h200.json": ("NVIDIA H200", "vs eager 6.33x", "3.18x over 6/6", "28.8%"),
        "optimizer_h100.json": ("NVIDIA H100", "vs eager 5.86x", "3.12x over 6/6", "29.8%"),
    }
    for name, figures in expected.items():
        out = _run(results / name)
        assert out.returncode == 0, out.stderr
        assert "not come from one" not in out.stdout and "different cards" not in out.stdout
        assert "has no summary" not in out.stdout
        for figure in figures:
            assert figure in out.stdout, (name, figure, out.stdout)


def _stopped_in_the_baseline(tmp_path: Path) -> None:
    """SIGTERM while the baseline session (in the script's own process) compiles the
    reference: the session stops and the row is saved with its search results and the
    baseline's error. The row is on disk from the session's start (seen here before the
    signal is sent), so a workload that outlasts the time from SIGTERM to SIGKILL loses
    nothing."""
    examples = SCRIPT.parents[1] / "src" / "kernelarc" / "examples"
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--problems", str(examples), "--only", "rmsnorm_h512"]
    cmd += ["--device", "cpu", "--budget", "1", "--agents", "reference", "--time-limit", "200"]
    cmd += ["--compile-sample", "0", "--out", str(out), "--runs-dir", str(tmp_path / "runs")]
    saved = out / "agents_bench.json"

    def in_baseline() -> bool:
        row = json.loads(saved.read_text())["rmsnorm_h512"] if saved.exists() else {}
        if "summary" not in row:
            return False
        assert "compile" not in row and row["best"]["per_workload"], row
        return True

    _sigterm_once(cmd, in_baseline, wait_s=300, exit_s=60,
                  early="the script ended before the baseline could be stopped")  # fmt: skip
    row = json.loads(saved.read_text())["rmsnorm_h512"]
    assert row["compile"]["error"] == "Stopped: SIGTERM during the baseline session", row
    assert row["summary"]["correct"].startswith("6/6") and row["summary"]["compile_n"] == 0
    assert not list(out.glob("*.tmp")), "a save left its temporary file"
