"""The run store: the conformance suite on both backends, and SQLite's own guarantees
(WAL, schema version, read-only mode, one writer, durability when the writer is killed)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kernelarc.agents.types import CandidateResult, Conclusion, IncumbentView, WorkloadResult
from kernelarc.problem.schema import Environment, Evaluation, Solution, Trace, Workload
from kernelarc.store.base import SCHEMA_VERSION, CandidateRecord, EvaluationRecord, StoreError
from kernelarc.store.conformance import check_store
from kernelarc.store.memory import MemoryStore
from kernelarc.store.sqlite import SQLiteStore

SOLUTION: dict[str, Any] = {
    "name": "s",
    "definition": "d",
    "author": "a",
    "spec": {"languages": ["pytorch"], "entry_point": "m.py::run"},
    "sources": [{"path": "m.py", "content": "def run(x):\n    return x\n"}],
}


def solution(i: int = 0) -> Solution:
    data = json.loads(json.dumps(SOLUTION))
    data["sources"][0]["content"] += f"# variant {i}\n"
    return Solution.model_validate(data)


def candidate(cid: str, i: int = 0) -> CandidateRecord:
    sol = solution(i)
    return CandidateRecord(
        id=cid,
        content_hash=sol.content_hash(),
        agent="a1",
        strategy="tiling",
        mode="draft",
        hypothesis="tile by 64",
        solution=sol,
    )


def trace() -> Trace:
    return Trace(
        definition="d",
        workload=Workload(uuid="w0", axes={"n": 4}),
        solution="s",
        evaluation=Evaluation(
            status="RUNTIME_ERROR",
            log="RuntimeError: boom",
            environment=Environment(hardware="cpu"),
            timestamp="2025-06-01T12:00:00+00:00",
        ),
    )


def result(cid: str) -> CandidateResult:
    return CandidateResult(
        candidate_id=cid,
        agent="a1",
        strategy="tiling",
        mode="draft",
        stage="screen",
        per_workload=(WorkloadResult(uuid="w0", axes={"n": 4}, status="RUNTIME_ERROR"),),
        passed=False,
        score=None,
        stopped_early="failed screening",
    )


def conclusion(cid: str) -> Conclusion:
    return Conclusion(
        agent="a1", strategy="tiling", candidate_id=cid, claim="crashes", outcome="failed"
    )


def incumbent(cid: str) -> IncumbentView:
    return IncumbentView(
        agent="a1",
        strategy="tiling",
        candidate_id=cid,
        score=1.5,
        latencies_ms={"w0": 0.2},
        solution=solution(),
    )


def fill(store: SQLiteStore | MemoryStore) -> None:
    store.open_run({"problem": "p"})
    store.add_candidate(candidate("c1"))
    store.add_evaluation(
        EvaluationRecord(candidate_id="c1", stage="screen", traces=[trace()], result=result("c1"))
    )
    store.add_conclusion(conclusion("c1"))
    store.set_incumbent(incumbent("c1"))
    store.save_agent_state("a1", {"round": 1})
    store.log_event("candidate", {"id": "c1"})


def reopen_sqlite(store: Any) -> SQLiteStore:
    assert isinstance(store, SQLiteStore)
    store.close()
    return SQLiteStore(store.path)


# ---------------------------------------------------------------- conformance


def test_memory_store_conforms() -> None:
    check_store(MemoryStore)


def test_sqlite_store_conforms(tmp_path: Path) -> None:
    names = itertools.count()
    check_store(lambda: SQLiteStore(tmp_path / f"s{next(names)}.sqlite"), reopen_sqlite)


class FirstHashForgotten(MemoryStore):
    """Answers candidate_by_hash with the latest candidate, not the first."""

    def candidate_by_hash(self, content_hash: str) -> CandidateRecord | None:
        found = [c for c in self.candidates() if c.content_hash == content_hash]
        return found[-1] if found else None


class ConfigOverwritten(MemoryStore):
    """Lets a resumed run replace the original config."""

    def open_run(self, config: dict[str, Any]) -> dict[str, Any]:
        self._config = None
        return super().open_run(config)


class StateAliased(MemoryStore):
    """Hands out its own dicts for agent states."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[str, dict[str, Any]] = {}

    def save_agent_state(self, agent: str, state: dict[str, Any]) -> None:
        super().save_agent_state(agent, state)
        self._live[agent] = state

    def agent_states(self) -> dict[str, dict[str, Any]]:
        return dict(self._live)


@pytest.mark.parametrize(
    ("broken", "check"),
    [
        (FirstHashForgotten, "hash_dedup"),
        (ConfigOverwritten, "run_config"),
        (StateAliased, "no_aliasing"),
    ],
)
def test_conformance_catches_broken_stores(broken: type[MemoryStore], check: str) -> None:
    with pytest.raises(AssertionError, match=rf"\[{check}\]"):
        check_store(broken)


def test_conformance_catches_a_store_that_forgets_on_reopen() -> None:
    with pytest.raises(AssertionError, match=r"\[reopen\].*candidates after reopening"):
        check_store(MemoryStore, lambda store: MemoryStore())


# ---------------------------------------------------------------- SQLite specifics


def test_sqlite_settings(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        assert store.pragmas() == {"journal_mode": "wal", "synchronous": 1, "foreign_keys": 1}
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "store.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    assert version == (str(SCHEMA_VERSION),)


def test_sqlite_refuses_another_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for readonly in (False, True):
        with pytest.raises(StoreError) as info:
            SQLiteStore(path, readonly=readonly)
        message = str(info.value)
        assert "version 99" in message and f"version {SCHEMA_VERSION}" in message
        assert "new run directory" in message


def test_sqlite_refuses_files_that_are_not_stores(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a readable SQLite store"):
        SQLiteStore(garbage)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(StoreError, match="not a KernelArc store"):
        SQLiteStore(other)
    with pytest.raises(StoreError, match="no store at"):
        SQLiteStore(tmp_path / "missing.sqlite", readonly=True)
    with pytest.raises(StoreError, match="does not exist"):
        SQLiteStore(tmp_path / "no-such-dir" / "store.sqlite")


def test_sqlite_readonly_reads_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    writer = SQLiteStore(path)
    fill(writer)
    reader = SQLiteStore(path, readonly=True)  # beside a live writer: no lock taken
    try:
        assert [c.id for c in reader.candidates()] == ["c1"]
        assert reader.open_run({"problem": "other"}) == {"problem": "p"}
        writer.add_candidate(candidate("c2", 2))
        assert [c.id for c in reader.candidates()] == ["c1", "c2"]
        writes = {
            "add_candidate": lambda: reader.add_candidate(candidate("c3", 3)),
            "add_evaluation": lambda: reader.add_evaluation(
                EvaluationRecord(candidate_id="c1", stage="full", result=result("c1"))
            ),
            "add_conclusion": lambda: reader.add_conclusion(conclusion("c1")),
            "set_incumbent": lambda: reader.set_incumbent(incumbent("c2")),
            "save_agent_state": lambda: reader.save_agent_state("a1", {"round": 9}),
            "log_event": lambda: reader.log_event("x", {}),
        }
        for write in writes.values():
            with pytest.raises(StoreError, match="read-only"):
                write()
        assert len(reader.evaluations()) == 1 and len(reader.conclusions()) == 1
        assert reader.incumbents()["a1"].candidate_id == "c1"
        assert reader.agent_states() == {"a1": {"round": 1}}
        assert [e.kind for e in reader.events()] == ["candidate"]
    finally:
        reader.close()
        writer.close()


def test_sqlite_readonly_new_store_has_no_config(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    SQLiteStore(path).close()
    reader = SQLiteStore(path, readonly=True)
    try:
        with pytest.raises(StoreError, match="no run config"):
            reader.open_run({"problem": "p"})
    finally:
        reader.close()


def test_sqlite_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    first = SQLiteStore(path)
    try:
        with pytest.raises(StoreError, match=f"is in use by pid {os.getpid()}"):
            SQLiteStore(path)
        script = (
            "import sys\n"
            "from kernelarc.store.base import StoreError\n"
            "from kernelarc.store.sqlite import SQLiteStore\n"
            "try:\n"
            "    SQLiteStore(sys.argv[1])\n"
            "except StoreError as e:\n"
            "    print(e)\n"
            "    sys.exit(3)\n"
        )
        child = subprocess.run(
            [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 3, child.stderr
        assert f"is in use by pid {os.getpid()}" in child.stdout
    finally:
        first.close()
    SQLiteStore(path).close()  # free again once the first writer closed


CHILD = """
import json, os, signal, sys
from kernelarc.problem.schema import Solution
from kernelarc.store.base import CandidateRecord
from kernelarc.store.sqlite import SQLiteStore

path, n, base = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
store = SQLiteStore(path)
store.open_run({"problem": "p"})
for i in range(n):
    base["sources"][0]["content"] = f"def run(x):\\n    return x + {i}\\n"
    sol = Solution.model_validate(base)
    store.add_candidate(CandidateRecord(
        id=f"c{i}", content_hash=sol.content_hash(), agent="a1", strategy="s",
        mode="draft", solution=sol))
    store.log_event("candidate", {"id": f"c{i}"})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sqlite_writes_survive_sigkill(tmp_path: Path) -> None:
    path, n = tmp_path / "store.sqlite", 25
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(n), json.dumps(SOLUTION)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    store = SQLiteStore(path)  # the dead writer's lock is gone with it
    try:
        got = store.candidates()
        assert [c.id for c in got] == [f"c{i}" for i in range(n)]
        assert [c.seq for c in got] == list(range(1, n + 1))
        assert got[-1].solution.sources[0].content == f"def run(x):\n    return x + {n - 1}\n"
        assert [e.payload["id"] for e in store.events("candidate")] == [c.id for c in got]
        assert store.open_run({"problem": "other"}) == {"problem": "p"}
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_concurrent_writers_in_threads(tmp_path: Path, backend: str) -> None:
    store: SQLiteStore | MemoryStore
    store = MemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "store.sqlite")
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(20):
                store.add_candidate(candidate(f"t{t}-{i}", 100 * t + i))
                store.log_event("candidate", {"id": f"t{t}-{i}"})
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        assert errors == []
        got = store.candidates()
        assert [c.seq for c in got] == list(range(1, 81))
        assert len({c.id for c in got}) == 80
        assert [e.seq for e in store.events()] == list(range(1, 81))
    finally:
        store.close()
