"""Tests of the typed worker messages (``guard/messages.py``) and of how a session treats a
reply that does not fit them: the candidate is rejected (``check-error``), never passed.

The session runs against stand-in workers that answer from a script, so each reply can be
malformed in exactly one way; the real workers' replies are covered by the guard tests
that start them (test_guard_compare, test_inplace_reference, test_corpus, ...)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernelarc.examples import example_dir
from kernelarc.guard.config import GuardConfig
from kernelarc.guard.isolation import Isolation
from kernelarc.guard.messages import (
    CandidateRan,
    CandidateSetup,
    ErrorReply,
    MalformedReply,
    Policy,
    ReferenceTimed,
    Request,
    RunRequest,
    TimeRequest,
    decode,
    read_request,
)
from kernelarc.guard.session import CandidateSession, SessionSettings
from kernelarc.problem.loader import Problem, load_problem
from kernelarc.problem.schema import EvaluationStatus, Solution, Workload

Answer = Callable[[Request], dict[str, Any]]


# ------------------------------------------------------------------------------ decode


def test_a_reply_without_ok_is_malformed() -> None:
    with pytest.raises(MalformedReply, match="ok"):
        decode({"summary": {"median_ms": 1.0}, "samples_ms": [1.0]}, ReferenceTimed)


def test_a_timing_summary_needs_a_numeric_median() -> None:
    ok = decode(
        {"ok": True, "summary": {"median_ms": 2.0, "n": 3}, "samples_ms": []}, ReferenceTimed
    )
    assert isinstance(ok, ReferenceTimed) and ok.summary == {"median_ms": 2.0, "n": 3}
    for bad in ({"n": 3}, {"median_ms": "fast"}, {"median_ms": True}):
        with pytest.raises(MalformedReply, match="median_ms"):
            decode({"ok": True, "summary": bad, "samples_ms": []}, ReferenceTimed)


def test_unknown_fields_and_unknown_error_kinds_are_malformed() -> None:
    with pytest.raises(MalformedReply):
        decode({"ok": True, "outputs": [], "writes": {"inputs": [], "aliases": {}}, "x": 1},
               CandidateRan)  # fmt: skip
    with pytest.raises(MalformedReply):
        decode({"error": "fine", "message": "all good"}, CandidateRan)


def test_an_error_reply_is_read_as_one() -> None:
    reply = decode(
        {"error": "runtime", "message": "boom", "violations": [{"check": "c", "detail": "d"}]},
        CandidateRan,
    )
    assert isinstance(reply, ErrorReply)
    assert reply.error == "runtime" and reply.violations[0].check == "c"


def test_requests_round_trip_and_setup_depends_on_the_role(problem: Problem) -> None:
    wl = problem.workloads[0]
    run = RunRequest(workload=wl, seed=7, exchange_dir="/x", copy_bytes=5)
    assert read_request("candidate", run.wire()) == run
    setup = {"op": "setup", "device": "cpu", "definition": problem.definition.model_dump()}
    assert read_request("reference", setup).model_dump()["device"] == "cpu"
    with pytest.raises(ValueError):
        read_request("candidate", setup)  # the candidate's setup carries the solution
    with pytest.raises(ValueError, match="unknown request op"):
        read_request("reference", {"op": "exec"})
    with pytest.raises(ValueError):
        read_request("reference", {**TimeRequest(workload=wl, seeds=[], warmup=0,
                                                 iterations=1).wire(), "seeds": "all"})  # fmt: skip


# ------------------------------------------------------------------------------ sessions


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(example_dir("rmsnorm_h512"))


class ScriptedWorker:
    """A stand-in worker process that answers each request with ``answer(request)``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self.killed = False

    def request(self, msg: Request, timeout: float) -> dict[str, Any]:
        self.requests.append(msg)
        return self.answer(msg)

    def wait_ready(self, timeout: float) -> None:
        pass

    def alive(self) -> bool:
        return not self.killed

    def kill(self) -> None:
        self.killed = True

    def close(self) -> None:
        self.killed = True


class ScriptedGuard:
    """The parts of ``Guard`` a session uses (``session.GuardSide``), with scripted workers."""

    def __init__(self, problem: Problem, tmp: Path, candidate: Answer, reference: Answer) -> None:
        self.problem, self.device, self.tmp, self.cache = problem, "cpu", tmp, tmp / "cache"
        self.isolation = Isolation((), "none (tests)")
        self.config = GuardConfig(device="cpu", rounds=1, warmup=1, iterations=2)
        self.cand = ScriptedWorker(candidate)
        self.ref = ScriptedWorker(reference)

    def settings(self, config: GuardConfig | None = None) -> SessionSettings:
        return SessionSettings(config=config or self.config)

    def reference(self) -> Any:
        return self.ref

    def candidate_worker(self, fresh_jit: bool = False) -> Any:
        return self.cand

    def prepare_spare(self) -> None:
        pass

    def policy(self) -> Policy:
        return Policy(forbidden_roots=[], problem_name=self.problem.definition.name,
                      library_roots=[])  # fmt: skip

    def one_timed_call(self, wl: Workload) -> bool:
        return False

    def reference_timing(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"median_ms": 1.0}


SETUP = {"ok": True, "environment": {"hardware": "cpu", "libs": {}}}
HEADERS = [{"file": "out.bin", "dtype": "float16", "shape": [1], "nbytes": 2}]
RAN = {"ok": True, "outputs": HEADERS, "writes": {"inputs": [], "aliases": {}}}
REF_RAN = {"ok": True, "cached": False, "writes": []}
OK_CHECK = {"status": "ok", "message": "", "matched_ratio": 1.0}
TIMED = {"ok": True, "summary": {"median_ms": 0.5}, "samples_ms": [0.5, 0.5], "pool": 2,
         "sampled": [{"seed": 3, "outputs": HEADERS}], "one_sample": False}  # fmt: skip


def candidate_answers(**override: dict[str, Any]) -> Answer:
    replies = {"setup": SETUP, "run": RAN, "time": TIMED, "release": {"ok": True}, **override}
    return lambda msg: copy.deepcopy(replies[msg.op])


def reference_answers(**override: dict[str, Any]) -> Answer:
    replies = {"run": REF_RAN, "compare": {"ok": True, "checks": [OK_CHECK]}, **override}
    return lambda msg: copy.deepcopy(replies[msg.op])


def judge(problem: Problem, tmp: Path, candidate: Answer, reference: Answer) -> Any:
    solution = Solution.model_validate(
        {
            "name": "scripted",
            "definition": problem.definition.name,
            "author": "tests",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "s.py::run",
                "destination_passing_style": True,
            },  # fmt: skip
            "sources": [{"path": "s.py", "content": "def run(*args):\n    pass\n"}],
        }
    )
    guard = ScriptedGuard(problem, tmp, candidate, reference)
    session = CandidateSession(guard, solution)
    try:
        return session.evaluate_workload(problem.workloads[0]), guard
    finally:
        session.close()


def test_well_formed_scripted_replies_pass(problem: Problem, tmp_path: Path) -> None:
    outcome, guard = judge(problem, tmp_path, candidate_answers(), reference_answers())
    assert outcome.status == EvaluationStatus.PASSED, outcome.log
    assert outcome.latency is not None and outcome.latency["median_ms"] == 0.5
    setup = guard.cand.requests[0]
    assert isinstance(setup, CandidateSetup) and setup.artifact.symbol == "run"


@pytest.mark.parametrize(
    ("candidate", "reference"),
    [
        (candidate_answers(setup={"environment": {}}), reference_answers()),
        (candidate_answers(run={**RAN, "writes": None}), reference_answers()),
        (
            candidate_answers(run={k: v for k, v in RAN.items() if k != "writes"}),
            reference_answers(),
        ),  # fmt: skip
        (candidate_answers(run={**RAN, "violations": [{"check": "x"}]}), reference_answers()),
        (candidate_answers(time={**TIMED, "summary": {"mean_ms": 0.1}}), reference_answers()),
        (candidate_answers(time={**TIMED, "sampled": [[3, HEADERS]]}), reference_answers()),
        (candidate_answers(), reference_answers(compare={"ok": True, "checks": [{"status": "?"}]})),
        (candidate_answers(), reference_answers(run={"ok": True, "cached": False})),
    ],
    ids=[
        "setup-without-ok",
        "writes-null",
        "writes-missing",
        "violation-without-detail",
        "summary-without-median",
        "samples-as-pairs",
        "unknown-check-status",
        "reference-run-without-writes",
    ],
)
def test_a_malformed_reply_rejects_the_candidate(
    problem: Problem, tmp_path: Path, candidate: Answer, reference: Answer
) -> None:
    outcome, _ = judge(problem, tmp_path, candidate, reference)
    assert outcome.status == EvaluationStatus.REWARD_HACK, outcome.log
    assert outcome.check == "check-error"
    assert "malformed" in outcome.log


def test_a_failed_gpu_exchange_turns_it_off_for_the_session_only(
    problem: Problem, tmp_path: Path
) -> None:
    """The session judges again through files and says so in its own settings; the guard
    that made the settings is not touched (it reads them back after the call)."""
    compares = iter([{"ok": True, "checks": [], "exchange_failed": "error 201"}])

    def reference(msg: Request) -> dict[str, Any]:
        if msg.op == "compare":
            return next(compares, {"ok": True, "checks": [OK_CHECK]})
        return copy.deepcopy(REF_RAN)

    seen: dict[str, Any] = {}

    def candidate(msg: Request) -> dict[str, Any]:
        if isinstance(msg, RunRequest):
            seen.setdefault("ipc", []).append(msg.ipc)
        return candidate_answers()(msg)

    guard = ScriptedGuard(problem, tmp_path, candidate, reference)
    guard.settings = lambda config=None: SessionSettings(  # type: ignore[method-assign]
        config=config or guard.config, gpu_exchange=True
    )
    solution = Solution.model_validate(
        {
            "name": "ipc",
            "definition": problem.definition.name,
            "author": "tests",
            "spec": {"languages": ["pytorch"], "entry_point": "s.py::run"},
            "sources": [{"path": "s.py", "content": "def run(*args):\n    pass\n"}],
        }
    )
    session = CandidateSession(guard, solution)
    outcome = session.evaluate_workload(problem.workloads[0])
    session.close()
    assert outcome.status == EvaluationStatus.PASSED, outcome.log
    assert any("CUDA IPC failed" in n for n in outcome.notes)
    assert seen["ipc"][0] is True and seen["ipc"][-1] is False
    assert session.settings.gpu_exchange is False
