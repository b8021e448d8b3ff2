"""The default run store: one SQLite file (``store.sqlite`` in the run directory).

Settings: WAL journal, ``synchronous=NORMAL``, foreign keys on. Every write method runs one
``BEGIN IMMEDIATE ... COMMIT`` transaction that is committed before it returns, so a process
killed at any point loses nothing a write method had returned (a power cut may lose the
last commits: that is what ``synchronous=NORMAL`` trades for speed).

One writer per store: a writer holds an exclusive ``flock`` on ``<path>.lock`` (which also
holds its pid) for as long as it is open; a second writer, in this process or another, gets
``StoreError`` naming that pid. The kernel drops the lock when the holder dies, so a killed
run can be resumed at once. Readers (``readonly=True``) take no lock and open the file with
``mode=ro``; any write method of a read-only store raises ``StoreError``.

The file carries its schema version (table ``meta``); a store of another version is refused.
Records are stored as ``model_dump_json`` text and read with ``model_validate_json``; dicts
as their JSON text (the encoding helpers are in ``kernelarc.store.memory``).

Not covered: migrations between schema versions, several writers, network file systems
(WAL needs shared memory on one host). A child the writer forks without exec inherits the
lock's descriptor and holds the lock until it exits (``subprocess`` children do not).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter

from kernelarc.agents.types import CandidateResult, Conclusion, IncumbentView
from kernelarc.problem.schema import Solution, Trace
from kernelarc.store.base import (
    SCHEMA_VERSION,
    CandidateRecord,
    EvaluationRecord,
    EventRecord,
    Store,
    StoreError,
)
from kernelarc.store.memory import decode_object, encode_model, encode_object, utc_now

T = TypeVar("T")

_TRACES: TypeAdapter[list[Trace]] = TypeAdapter(list[Trace])

_CANDIDATE_FIELDS = (
    "id", "seq", "content_hash", "agent", "strategy", "mode", "parent_id", "hypothesis", "solution"
)  # fmt: skip
_CANDIDATE_COLUMNS = ", ".join(_CANDIDATE_FIELDS)
_CANDIDATES = f"SELECT {_CANDIDATE_COLUMNS} FROM candidates"
_EVALUATIONS = "SELECT seq, candidate_id, stage, traces, result FROM evaluations"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    config TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE candidates (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    content_hash TEXT NOT NULL,
    agent TEXT NOT NULL,
    strategy TEXT NOT NULL,
    mode TEXT NOT NULL,
    parent_id TEXT,
    hypothesis TEXT NOT NULL,
    solution TEXT NOT NULL
);
CREATE INDEX candidates_by_hash ON candidates (content_hash, seq);
CREATE TABLE evaluations (
    seq INTEGER PRIMARY KEY,
    candidate_id TEXT NOT NULL REFERENCES candidates (id),
    stage TEXT NOT NULL,
    traces TEXT NOT NULL,
    result TEXT NOT NULL
);
CREATE INDEX evaluations_by_candidate ON evaluations (candidate_id, seq);
CREATE TABLE conclusions (
    seq INTEGER PRIMARY KEY,
    agent TEXT NOT NULL,
    candidate_id TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE incumbents (agent TEXT PRIMARY KEY, candidate_id TEXT NOT NULL, view TEXT NOT NULL);
CREATE TABLE agent_states (agent TEXT PRIMARY KEY, state TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX events_by_kind ON events (kind, seq);
"""


class SQLiteStore(Store):
    """A ``Store`` in one SQLite file; one connection shared by the caller's threads."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        self._conn: sqlite3.Connection | None = None
        try:
            if readonly:
                self._conn = self._connect_readonly()
                self._read_version(self._conn)
            else:
                self._lock_fd = self._acquire_writer_lock()
                self._conn = self._connect_writer()
                self._write(self._create_or_check)
        except sqlite3.DatabaseError as e:
            self.close()
            raise StoreError(
                f"{self.path}: not a readable SQLite store ({e}); point at a run directory's "
                "store.sqlite or start a new run"
            ) from e
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def _acquire_writer_lock(self) -> int:
        if not self.path.parent.is_dir():
            raise StoreError(
                f"run directory {self.path.parent} does not exist: create it before "
                "opening its store"
            )
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"run directory {self.path.parent} is in use by pid {holder} (it holds "
                f"{self.lock_path}): wait for that run to end or stop it, then resume"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _connect_writer(self) -> sqlite3.Connection:
        conn = self._connect(str(self.path), uri=False)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(
                f"{self.path}: SQLite refused WAL journal mode (got {mode!r}); put the run "
                "directory on a local file system"
            )
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _connect_readonly(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise StoreError(f"no store at {self.path}: is this a KernelArc run directory?")
        conn = self._connect(self.path.resolve().as_uri() + "?mode=ro", uri=True)
        conn.execute("PRAGMA query_only=ON")
        return conn

    def _connect(self, target: str, *, uri: bool) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                target, uri=uri, isolation_level=None, check_same_thread=False, timeout=10.0
            )
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot open the SQLite store ({e})") from e
        self._conn = conn  # closed by __init__ if anything below fails
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _create_or_check(self, conn: sqlite3.Connection) -> None:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            return
        self._read_version(conn)

    def _read_version(self, conn: sqlite3.Connection) -> None:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        row = (
            conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if has_meta
            else None
        )
        if row is None:
            raise StoreError(
                f"{self.path} is a SQLite file but not a KernelArc store (no schema version): "
                "point at a run directory's store.sqlite or start a new run"
            )
        found = str(row[0])
        if found != str(SCHEMA_VERSION):
            raise StoreError(
                f"{self.path} has store schema version {found}, but this KernelArc reads "
                f"version {SCHEMA_VERSION}: open it with a KernelArc release of schema version "
                f"{found}, or start a new run directory"
            )

    # ------------------------------------------------------------------ plumbing

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"the store {self.path} is closed: open it again")
        return self._conn

    def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``body`` in one immediate transaction, committed before returning."""
        with self._lock:
            conn = self._connection()
            if self.readonly:
                raise StoreError(
                    f"the store {self.path} is open read-only: only the run's orchestrator "
                    "writes to it"
                )
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = body(conn)
                    conn.execute("COMMIT")
                finally:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: the write failed and was undone ({e})") from e
            return result

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: reading the store failed ({e})") from e

    @staticmethod
    def _next_seq(conn: sqlite3.Connection, table: str) -> int:
        row = conn.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}").fetchone()
        return int(row[0])

    # ------------------------------------------------------------------ run config

    def open_run(self, config: dict[str, Any]) -> dict[str, Any]:
        text = encode_object(config, "run config")
        if self.readonly:
            with self._reading() as conn:
                row = conn.execute("SELECT config FROM run WHERE id = 1").fetchone()
            if row is None:
                raise StoreError(f"the read-only store {self.path} has no run config yet")
            return decode_object(row[0], "run config")

        def body(conn: sqlite3.Connection) -> str:
            row = conn.execute("SELECT config FROM run WHERE id = 1").fetchone()
            if row is not None:
                return str(row[0])
            conn.execute(
                "INSERT INTO run (id, config, created_at) VALUES (1, ?, ?)", (text, utc_now())
            )
            return text

        return decode_object(self._write(body), "run config")

    # ------------------------------------------------------------------ candidates

    def add_candidate(self, record: CandidateRecord) -> CandidateRecord:
        def body(conn: sqlite3.Connection) -> tuple[Any, ...]:
            if conn.execute("SELECT 1 FROM candidates WHERE id = ?", (record.id,)).fetchone():
                raise StoreError(
                    f"candidate id {record.id!r} is already in the store: ids must be unique"
                )
            stored = record.model_copy(update={"seq": self._next_seq(conn, "candidates")})
            encode_model(stored, f"candidate {record.id!r}")
            row = tuple(getattr(stored, f) for f in _CANDIDATE_FIELDS[:-1])
            row += (stored.solution.model_dump_json(),)
            marks = ", ".join("?" * len(row))
            conn.execute(f"INSERT INTO candidates ({_CANDIDATE_COLUMNS}) VALUES ({marks})", row)
            return row

        return _candidate_from_row(self._write(body))

    def _select(self, query: str, where: str, args: tuple[Any, ...]) -> list[Any]:
        with self._reading() as conn:
            sql = query + (f" WHERE {where}" if where else "") + " ORDER BY seq"
            return conn.execute(sql, args).fetchall()

    def candidates(self) -> list[CandidateRecord]:
        return [_candidate_from_row(r) for r in self._select(_CANDIDATES, "", ())]

    def candidate(self, candidate_id: str) -> CandidateRecord | None:
        rows = self._select(_CANDIDATES, "id = ?", (candidate_id,))
        return _candidate_from_row(rows[0]) if rows else None

    def candidate_by_hash(self, content_hash: str) -> CandidateRecord | None:
        rows = self._select(_CANDIDATES, "content_hash = ?", (content_hash,))
        return _candidate_from_row(rows[0]) if rows else None

    # ------------------------------------------------------------------ evaluations

    def add_evaluation(self, record: EvaluationRecord) -> EvaluationRecord:
        def body(conn: sqlite3.Connection) -> tuple[Any, ...]:
            if not conn.execute(
                "SELECT 1 FROM candidates WHERE id = ?", (record.candidate_id,)
            ).fetchone():
                raise StoreError(
                    f"evaluation of unknown candidate {record.candidate_id!r}: "
                    "add the candidate before its evaluations"
                )
            stored = record.model_copy(update={"seq": self._next_seq(conn, "evaluations")})
            encode_model(stored, f"evaluation of candidate {record.candidate_id!r}")
            traces = _TRACES.dump_json(stored.traces).decode()
            result = stored.result.model_dump_json()
            row = (stored.seq, stored.candidate_id, stored.stage, traces, result)
            conn.execute(
                "INSERT INTO evaluations (seq, candidate_id, stage, traces, result) "
                "VALUES (?, ?, ?, ?, ?)",
                row,
            )
            return row

        return _evaluation_from_row(self._write(body))

    def evaluations(self, candidate_id: str | None = None) -> list[EvaluationRecord]:
        where, args = ("", ()) if candidate_id is None else ("candidate_id = ?", (candidate_id,))
        return [_evaluation_from_row(r) for r in self._select(_EVALUATIONS, where, args)]

    # ------------------------------------------------------------------ conclusions

    def add_conclusion(self, conclusion: Conclusion) -> Conclusion:
        def body(conn: sqlite3.Connection) -> str:
            stored = conclusion.model_copy(update={"seq": self._next_seq(conn, "conclusions")})
            text = encode_model(stored, f"conclusion on candidate {conclusion.candidate_id!r}")
            conn.execute(
                "INSERT INTO conclusions (seq, agent, candidate_id, body) VALUES (?, ?, ?, ?)",
                (stored.seq, stored.agent, stored.candidate_id, text),
            )
            return text

        return Conclusion.model_validate_json(self._write(body))

    def conclusions(self) -> list[Conclusion]:
        rows = self._select("SELECT body FROM conclusions", "", ())
        return [Conclusion.model_validate_json(r[0]) for r in rows]

    # ------------------------------------------------------------------ incumbents, states

    def set_incumbent(self, view: IncumbentView) -> None:
        text = encode_model(view, f"incumbent of agent {view.agent!r}")
        self._write(
            lambda conn: conn.execute(
                "INSERT INTO incumbents (agent, candidate_id, view) VALUES (?, ?, ?) "
                "ON CONFLICT (agent) DO UPDATE SET candidate_id = excluded.candidate_id, "
                "view = excluded.view",
                (view.agent, view.candidate_id, text),
            )
        )

    def incumbents(self) -> dict[str, IncumbentView]:
        """Keyed by agent, in agent-name order."""
        with self._reading() as conn:
            rows = conn.execute("SELECT agent, view FROM incumbents ORDER BY agent").fetchall()
        return {agent: IncumbentView.model_validate_json(view) for agent, view in rows}

    def save_agent_state(self, agent: str, state: dict[str, Any]) -> None:
        text = encode_object(state, f"state of agent {agent!r}")
        self._write(
            lambda conn: conn.execute(
                "INSERT INTO agent_states (agent, state, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (agent) DO UPDATE SET state = excluded.state, "
                "updated_at = excluded.updated_at",
                (agent, text, utc_now()),
            )
        )

    def agent_states(self) -> dict[str, dict[str, Any]]:
        """Keyed by agent, in agent-name order."""
        with self._reading() as conn:
            rows = conn.execute("SELECT agent, state FROM agent_states ORDER BY agent").fetchall()
        return {agent: decode_object(state, f"state of agent {agent!r}") for agent, state in rows}

    # ------------------------------------------------------------------ events

    def log_event(self, kind: str, payload: dict[str, Any]) -> EventRecord:
        text = encode_object(payload, f"payload of event {kind!r}")

        def body(conn: sqlite3.Connection) -> EventRecord:
            seq, at = self._next_seq(conn, "events"), utc_now()
            conn.execute(
                "INSERT INTO events (seq, kind, payload, at) VALUES (?, ?, ?, ?)",
                (seq, kind, text, at),
            )
            return EventRecord(seq=seq, kind=kind, payload=json.loads(text), at=at)

        return self._write(body)

    def events(self, kind: str | None = None) -> list[EventRecord]:
        where, args = ("", ()) if kind is None else ("kind = ?", (kind,))
        rows = self._select("SELECT seq, kind, payload, at FROM events", where, args)
        return [
            EventRecord(seq=seq, kind=k, payload=decode_object(payload, "event payload"), at=at)
            for seq, k, payload, at in rows
        ]

    # ------------------------------------------------------------------ diagnostics, close

    def pragmas(self) -> dict[str, int | str]:
        """The connection's journal mode, synchronous level and foreign-key setting."""
        with self._reading() as conn:
            return {
                name: conn.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("journal_mode", "synchronous", "foreign_keys")
            }

    def close(self) -> None:
        """Close the connection and release the writer lock; closing twice is harmless."""
        with self._lock:
            conn, self._conn = self._conn, None
            fd, self._lock_fd = self._lock_fd, None
            try:
                if conn is not None:
                    conn.close()
            finally:
                if fd is not None:
                    os.close(fd)  # releases the flock


def _candidate_from_row(row: tuple[Any, ...]) -> CandidateRecord:
    fields = dict(zip(_CANDIDATE_FIELDS, row, strict=True))
    fields["solution"] = Solution.model_validate_json(fields["solution"])
    return CandidateRecord.model_validate(fields)


def _evaluation_from_row(row: tuple[Any, ...]) -> EvaluationRecord:
    seq, candidate_id, stage, traces, result = row
    return EvaluationRecord(
        seq=seq,
        candidate_id=candidate_id,
        stage=stage,
        traces=_TRACES.validate_json(traces),
        result=CandidateResult.model_validate_json(result),
    )
