"""The conformance suite every ``Store`` backend must pass: ``check_store``.

Public API, independent of pytest: it raises ``AssertionError`` naming the check and what
differed, and uses no ``assert`` statements (so it also checks under ``python -O``).

Covered: round trips of every record type (candidates, evaluations with traces, conclusions,
incumbents, agent states, events, run config); ``seq`` assigned by the store and strictly
increasing in insertion order; ``candidate_by_hash`` returning the first candidate of a hash;
unique candidate ids; evaluations only of known candidates; ``open_run`` keeping the first
config; incumbents and agent states replaced per agent; filtering of evaluations by candidate
and of events by kind; values JSON cannot hold refused with ``StoreError``; no aliasing
between what callers pass or get and what the store holds; a closed store refusing use;
and, when ``reopen`` is given, everything written surviving a reopen, with ``seq`` carrying on.

Not covered: backend-specific behaviour (durability under a crash, locking between
processes, read-only mode, schema versions): each backend's own tests check those.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from kernelarc.agents.types import CandidateResult, Conclusion, IncumbentView, WorkloadResult
from kernelarc.problem.schema import (
    Correctness,
    Environment,
    Evaluation,
    EvaluationStatus,
    Performance,
    Solution,
    Trace,
    Workload,
)
from kernelarc.store.base import CandidateRecord, EvaluationRecord, Store, StoreError

StoreFactory = Callable[[], Store]
Stage = Literal["screen", "full"]


def check_store(factory: StoreFactory, reopen: Callable[[Store], Store] | None = None) -> None:
    """Run every check on fresh stores from ``factory`` (each must start empty).

    ``reopen(store)`` must close ``store`` and return a store over the same data (for SQLite:
    the same file opened again); when given, persistence across a reopen is checked too.
    """
    for check in _CHECKS:
        name = check.__name__.removeprefix("_check_")
        store = factory()
        try:
            _expect_empty(store)
            check(store)
        except AssertionError as e:
            raise AssertionError(f"store conformance [{name}]: {e}") from e
        finally:
            store.close()
    if reopen is not None:
        try:
            _check_reopen(factory, reopen)
        except AssertionError as e:
            raise AssertionError(f"store conformance [reopen]: {e}") from e


# ---------------------------------------------------------------- sample records


def _solution(tag: str) -> Solution:
    return Solution.model_validate(
        {
            "name": f"s-{tag}",
            "definition": "d",
            "author": "conformance",
            "spec": {"languages": ["pytorch"], "entry_point": "m.py::run"},
            "sources": [{"path": "m.py", "content": f"def run(x):\n    return x  # {tag}\n"}],
        }
    )


def _candidate(cid: str, tag: str | None = None, **fields: Any) -> CandidateRecord:
    solution = _solution(tag or cid)
    values: dict[str, Any] = {
        "id": cid,
        "content_hash": solution.content_hash(),
        "agent": "a1",
        "strategy": "tiling",
        "mode": "refine",
        "hypothesis": f"hypothesis of {cid}",
        "solution": solution,
    }
    return CandidateRecord(**(values | fields))


def _trace(uuid: str, passed: bool) -> Trace:
    env = Environment(hardware="cpu", libs={"torch": "2"})
    if passed:
        evaluation = Evaluation(
            status=EvaluationStatus.PASSED,
            environment=env,
            timestamp="2025-01-01T00:00:00+00:00",
            correctness=Correctness(max_relative_error=1e-4, max_absolute_error=2e-5),
            performance=Performance(latency_ms=0.5, reference_latency_ms=1.0, speedup_factor=2),
        )
    else:
        evaluation = Evaluation(
            status=EvaluationStatus.RUNTIME_ERROR,
            log="RuntimeError: boom",
            environment=env,
            timestamp="2025-01-01T00:00:00+00:00",
        )
    return Trace(
        definition="d",
        workload=Workload(uuid=uuid, axes={"n": 8}),
        solution="s",
        evaluation=evaluation,
    )


def _evaluation(cid: str, stage: Stage, passed: bool) -> EvaluationRecord:
    status = "PASSED" if passed else "RUNTIME_ERROR"
    per_workload = tuple(
        WorkloadResult(
            uuid=f"w{i}",
            axes={"n": 8},
            status=status,
            latency_ms=0.5 if passed else None,
            reference_ms=1.0 if passed else None,
            log="" if passed else "RuntimeError: boom",
        )
        for i in range(2)
    )
    result = CandidateResult(
        candidate_id=cid,
        agent="a1",
        strategy="tiling",
        mode="refine",
        stage=stage,
        per_workload=per_workload,
        passed=passed,
        score=2.0 if passed else None,
        stopped_early=None if passed else "failed screening",
    )
    traces = [_trace(f"w{i}", passed) for i in range(2)]
    return EvaluationRecord(candidate_id=cid, stage=stage, traces=traces, result=result)


def _conclusion(agent: str, cid: str, claim: str) -> Conclusion:
    return Conclusion(
        agent=agent,
        strategy="tiling",
        candidate_id=cid,
        claim=claim,
        effect={"memory-bound, batch<=64": 1.25},
        tags=("tiling", "smem"),
        outcome="improved",
    )


def _incumbent(agent: str, cid: str, score: float) -> IncumbentView:
    return IncumbentView(
        agent=agent,
        strategy="tiling",
        candidate_id=cid,
        score=score,
        latencies_ms={"w0": 0.5, "w1": 0.7},
        solution=_solution(cid),
    )


# ---------------------------------------------------------------- helpers


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _expect_equal(got: Any, want: Any, what: str) -> None:
    if got != want:
        raise AssertionError(f"{what}: got {_short(got)}, want {_short(want)}")


def _expect_store_error(action: Callable[[], Any], what: str) -> StoreError:
    try:
        action()
    except StoreError as e:
        return e
    except Exception as e:
        raise AssertionError(
            f"{what}: raised {type(e).__name__} ({e}) instead of StoreError"
        ) from e
    raise AssertionError(f"{what}: no StoreError was raised")


def _without_seq(records: list[Any]) -> list[Any]:
    return [r.model_dump(exclude={"seq"}) for r in records]


def _expect_increasing(seqs: list[int], what: str) -> None:
    _expect(
        all(s > 0 for s in seqs) and all(a < b for a, b in zip(seqs, seqs[1:], strict=False)),
        f"{what}: seq must be positive and strictly increasing in insertion order, got {seqs}",
    )


def _expect_empty(store: Store) -> None:
    _expect(
        not (
            store.candidates()
            or store.evaluations()
            or store.conclusions()
            or store.incumbents()
            or store.agent_states()
            or store.events()
        ),
        "the factory must return an empty store",
    )


# ---------------------------------------------------------------- checks


def _check_run_config(store: Store) -> None:
    config = {"problem": "p", "budget": {"candidates": 8}, "agents": ["a1", "a2"], "seed": 0}
    _expect_equal(store.open_run(config), config, "open_run on a new store")
    _expect_equal(store.open_run({"problem": "other"}), config, "open_run with another config")
    _expect_equal(store.open_run({}), config, "open_run a third time")


def _check_candidates(store: Store) -> None:
    records = [
        _candidate("c1"),
        _candidate("c2", parent_id="c1", mode="draft", strategy="fusion", agent="a2"),
        _candidate("c3", seq=1000, hypothesis=""),
    ]
    returned = [store.add_candidate(r) for r in records]
    _expect_equal(_without_seq(returned), _without_seq(records), "add_candidate's returns")
    _expect_increasing([r.seq for r in returned], "add_candidate")
    _expect(returned[2].seq != 1000, "seq must be assigned by the store, not taken from the record")
    _expect_equal(store.candidates(), returned, "candidates()")
    for r in returned:
        _expect_equal(store.candidate(r.id), r, f"candidate({r.id!r})")
    _expect_equal(store.candidate("missing"), None, "candidate('missing')")


def _check_duplicate_id(store: Store) -> None:
    first = store.add_candidate(_candidate("c1"))
    _expect_store_error(
        lambda: store.add_candidate(_candidate("c1", tag="other")), "a second candidate id 'c1'"
    )
    _expect_equal(store.candidates(), [first], "candidates() after a refused duplicate")


def _check_hash_dedup(store: Store) -> None:
    c1 = store.add_candidate(_candidate("c1", tag="x"))
    c2 = store.add_candidate(_candidate("c2", tag="y"))
    store.add_candidate(_candidate("c3", tag="x", agent="a2"))
    first = store.candidate_by_hash(c1.content_hash)
    _expect_equal(first and first.id, "c1", "the id of candidate_by_hash (first of c1, c3)")
    _expect_equal(first, c1, "candidate_by_hash (first)")
    _expect_equal(store.candidate_by_hash(c2.content_hash), c2, "candidate_by_hash")
    _expect_equal(store.candidate_by_hash("0" * 64), None, "candidate_by_hash (unknown)")


def _check_evaluations(store: Store) -> None:
    store.add_candidate(_candidate("c1"))
    store.add_candidate(_candidate("c2"))
    records = [
        _evaluation("c1", "screen", False),
        _evaluation("c2", "full", True),
        _evaluation("c1", "full", True),
    ]
    returned = [store.add_evaluation(r) for r in records]
    _expect_equal(_without_seq(returned), _without_seq(records), "add_evaluation's returns")
    _expect_increasing([r.seq for r in returned], "add_evaluation")
    _expect_equal(store.evaluations(), returned, "evaluations()")
    _expect_equal(store.evaluations("c1"), [returned[0], returned[2]], "evaluations('c1')")
    _expect_equal(store.evaluations("c2"), [returned[1]], "evaluations('c2')")
    _expect_equal(store.evaluations("missing"), [], "evaluations('missing')")
    _expect_store_error(
        lambda: store.add_evaluation(_evaluation("ghost", "full", True)),
        "an evaluation of an unknown candidate",
    )
    _expect_equal(store.evaluations(), returned, "evaluations() after a refused evaluation")


def _check_conclusions(store: Store) -> None:
    records = [_conclusion("a1", "c1", "tiling by 64 helps"), _conclusion("a2", "c2", "no gain")]
    returned = [store.add_conclusion(c) for c in records]
    _expect_equal(_without_seq(returned), _without_seq(records), "add_conclusion's returns")
    _expect_increasing([c.seq for c in returned], "add_conclusion")
    _expect_equal(store.conclusions(), returned, "conclusions()")


def _check_incumbents(store: Store) -> None:
    first, other = _incumbent("a1", "c1", 1.2), _incumbent("a2", "c2", 1.5)
    better = _incumbent("a1", "c3", 1.9)
    store.set_incumbent(first)
    store.set_incumbent(other)
    _expect_equal(store.incumbents(), {"a1": first, "a2": other}, "incumbents()")
    store.set_incumbent(better)
    _expect_equal(store.incumbents(), {"a1": better, "a2": other}, "incumbents() after a1's new")


def _check_agent_states(store: Store) -> None:
    store.save_agent_state("a1", {"round": 1, "notes": ["x"], "temperature": 0.5, "done": False})
    store.save_agent_state("a2", {"round": 3, "nested": {"k": None}})
    store.save_agent_state("a1", {"round": 2})
    want = {"a1": {"round": 2}, "a2": {"round": 3, "nested": {"k": None}}}
    _expect_equal(store.agent_states(), want, "agent_states()")


def _check_events(store: Store) -> None:
    logged = [
        store.log_event("start", {}),
        store.log_event("candidate", {"id": "c1", "score": 1.5}),
        store.log_event("candidate", {"id": "c2", "tags": ["a", "b"]}),
        store.log_event("stop", {"reason": "budget"}),
    ]
    _expect_increasing([e.seq for e in logged], "log_event")
    _expect_equal([e.payload for e in logged][1], {"id": "c1", "score": 1.5}, "an event payload")
    _expect_equal(store.events(), logged, "events()")
    _expect_equal(store.events("candidate"), logged[1:3], "events('candidate')")
    _expect_equal(store.events("missing"), [], "events('missing')")
    for e in logged:
        try:
            at = datetime.fromisoformat(e.at)
        except ValueError as err:
            raise AssertionError(f"event time {e.at!r} is not ISO 8601") from err
        _expect(at.utcoffset() == timedelta(0), f"event time {e.at!r} must be in UTC")


def _check_json_values(store: Store) -> None:
    bad: dict[str, Any] = {"x": object()}
    _expect_store_error(lambda: store.open_run(bad), "a run config JSON cannot hold")
    _expect_store_error(
        lambda: store.save_agent_state("a1", bad), "an agent state JSON cannot hold"
    )
    _expect_store_error(lambda: store.log_event("e", bad), "an event payload JSON cannot hold")
    _expect_equal(store.open_run({"ok": True}), {"ok": True}, "open_run after a refused config")
    _expect_equal(store.agent_states(), {}, "agent_states() after a refused state")
    _expect_equal(store.events(), [], "events() after a refused payload")


def _check_no_aliasing(store: Store) -> None:
    config: dict[str, Any] = {"budget": {"candidates": 8}}
    store.open_run(config)
    config["budget"]["candidates"] = 99
    store.open_run({})["budget"]["candidates"] = 77
    _expect_equal(store.open_run({}), {"budget": {"candidates": 8}}, "config after mutations")

    state: dict[str, Any] = {"notes": ["x"]}
    store.save_agent_state("a1", state)
    state["notes"].append("passed-in")
    store.agent_states()["a1"]["notes"].append("returned")
    _expect_equal(store.agent_states(), {"a1": {"notes": ["x"]}}, "agent state after mutations")

    payload: dict[str, Any] = {"ids": ["c1"]}
    event = store.log_event("e", payload)
    payload["ids"].append("passed-in")
    event.payload["ids"].append("returned")
    store.events()[0].payload["ids"].append("listed")
    _expect_equal(store.events()[0].payload, {"ids": ["c1"]}, "event payload after mutations")

    record = _candidate("c1")
    added = store.add_candidate(record)
    record.solution.sources[0].content = "passed-in"
    added.solution.sources[0].content = "returned"
    store.candidates()[0].solution.sources[0].content = "listed"
    want_source = _solution("c1").sources[0].content
    got = store.candidate("c1")
    _expect(got is not None, "candidate('c1') vanished")
    if got is not None:
        _expect_equal(got.solution.sources[0].content, want_source, "candidate after mutations")

    view = _incumbent("a1", "c1", 1.5)
    store.set_incumbent(view)
    view.latencies_ms["w0"] = 99.0
    store.incumbents()["a1"].latencies_ms["w1"] = 99.0
    _expect_equal(
        store.incumbents()["a1"], _incumbent("a1", "c1", 1.5), "incumbent after mutations"
    )

    evaluation = store.add_evaluation(_evaluation("c1", "full", True))
    evaluation.traces.clear()
    store.evaluations()[0].traces.append(_trace("extra", True))
    _expect_equal(len(store.evaluations()[0].traces), 2, "traces after mutations")


def _check_closed(store: Store) -> None:
    store.close()
    _expect_store_error(store.candidates, "candidates() on a closed store")
    _expect_store_error(lambda: store.log_event("e", {}), "log_event on a closed store")
    store.close()  # a second close is harmless


_CHECKS: tuple[Callable[[Store], None], ...] = (
    _check_run_config,
    _check_candidates,
    _check_duplicate_id,
    _check_hash_dedup,
    _check_evaluations,
    _check_conclusions,
    _check_incumbents,
    _check_agent_states,
    _check_events,
    _check_json_values,
    _check_no_aliasing,
    _check_closed,
)


def _snapshot(store: Store) -> dict[str, Any]:
    return {
        "candidates": store.candidates(),
        "evaluations": store.evaluations(),
        "conclusions": store.conclusions(),
        "incumbents": store.incumbents(),
        "agent_states": store.agent_states(),
        "events": store.events(),
    }


def _check_reopen(factory: StoreFactory, reopen: Callable[[Store], Store]) -> None:
    config = {"problem": "p", "seed": 3}
    store = factory()
    try:
        store.open_run(config)
        for cid, parent in (("c1", None), ("c2", "c1"), ("c3", "c1")):
            store.add_candidate(_candidate(cid, parent_id=parent))
        store.add_evaluation(_evaluation("c1", "screen", False))
        store.add_evaluation(_evaluation("c2", "full", True))
        store.add_conclusion(_conclusion("a1", "c2", "fusing the epilogue helps"))
        store.set_incumbent(_incumbent("a1", "c1", 1.1))
        store.set_incumbent(_incumbent("a1", "c2", 2.0))
        store.save_agent_state("a1", {"round": 4})
        store.log_event("candidate", {"id": "c2"})
        before = _snapshot(store)
    except BaseException:
        store.close()
        raise
    store = reopen(store)
    try:
        after = _snapshot(store)
        for key, value in before.items():
            _expect_equal(after[key], value, f"{key} after reopening")
        _expect_equal(store.open_run({"problem": "other"}), config, "run config after reopening")
        added = store.add_candidate(_candidate("c4"))
        last = max(c.seq for c in before["candidates"])
        _expect(
            added.seq > last, f"a candidate added after reopening got seq {added.seq} <= {last}"
        )
        event = store.log_event("stop", {})
        last = max(e.seq for e in before["events"])
        _expect(event.seq > last, f"an event logged after reopening got seq {event.seq} <= {last}")
    finally:
        store.close()
