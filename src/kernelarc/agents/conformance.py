"""The conformance checks every agent must pass: ``check_agent`` and the ``check_*`` it runs.

Public API, independent of pytest: each check raises ``AssertionError`` naming the check
(``agent conformance [propose]: ...``) and what was wrong, and uses no ``assert``
statements (so it also checks under ``python -O``). An unexpected exception raised by the
agent is reported the same way. Every check starts from a fresh agent of ``make_agent``.

Covered, for one agent on one problem:

- ``identity``: ``name`` and ``strategy`` are non-empty one-word strings; a listed agent
  (one ``kernelarc agents`` shows) has a one-line class attribute ``description``.
- ``propose``: a few successive calls each return None or a :class:`Proposal` whose
  Solution validates from its JSON, names the problem's definition and builds with the real
  builder (``choose_builder``); the context (with board, incumbent, conclusions, bounds) is
  not mutated, deeply; each call takes at most ``max_propose_s`` seconds unless the agent
  documents a subprocess (class attribute ``documented_subprocess = True``).
- ``must_draft``: with ``must_draft`` set the answer is None or a proposal in mode "draft".
- ``observe``: on constructed verdicts (passed, failed with a log, cached, screening stage
  only, improved) the conclusion carries the agent's name and strategy and the candidate's
  id, a non-empty claim of at most 300 characters that the shared memory accepts (no code,
  :func:`kernelarc.agents.memory.check_claim`), finite positive effects, and an outcome
  consistent with the verdict (failed iff not passed; improved when the verdict says so).
- ``state``: ``state()`` survives ``json.dumps``/``json.loads``; a fresh agent restored from
  it makes the same next proposal (same content hash, or None for both).
- ``restore_rejects_garbage``: replacing any one top-level key of the state by a value of
  another JSON type makes ``restore`` raise ``ValueError`` (not another exception).
- ``rebase`` (agents that are also :class:`~kernelarc.agents.base.Rebasing`): a proposal
  made on an empty board, rebased on the rich context, gives None or a proposal that passes
  the ``propose`` checks; the context is not mutated; the state afterwards survives JSON.

Not covered: whether the strategy is any good, real guard verdicts (the agent's own tests
judge its candidates through the guard), C++ builds on machines without a toolchain (they
fail the ``propose`` check there), and ``observe`` for agents that never propose on this
device (nothing to observe; the check passes vacuously, e.g. CUDA-only agents on the CPU).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, get_args

from kernelarc.agents.base import Agent, Rebasing
from kernelarc.agents.memory import check_claim
from kernelarc.agents.types import (
    AgentContext,
    BoardSnapshot,
    CandidateResult,
    Conclusion,
    IncumbentView,
    Outcome,
    Proposal,
    WorkloadResult,
)
from kernelarc.guard.build import choose_builder
from kernelarc.guard.build_base import BuildError
from kernelarc.problem.loader import Problem
from kernelarc.problem.schema import Solution

AgentFactory = Callable[[], Agent]
DEFAULT_MAX_PROPOSE_S = 10.0
PROPOSE_CALLS = 3
FAIL_LOG = (
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "  (raised by the candidate's kernel on the first call)"
)


def check_agent(
    make_agent: AgentFactory,
    problem: Problem,
    device: str = "cpu",
    *,
    listed: bool = True,
    max_propose_s: float = DEFAULT_MAX_PROPOSE_S,
) -> None:
    """Run every check on fresh agents from ``make_agent`` for ``problem`` on ``device``.
    ``listed=False`` for test-only agents that ``kernelarc agents`` does not show (they need
    no description)."""
    check_identity(make_agent, listed=listed)
    check_propose(make_agent, problem, device, max_propose_s=max_propose_s)
    check_must_draft(make_agent, problem, device)
    check_observe(make_agent, problem, device)
    check_state(make_agent, problem, device)
    check_restore_rejects_garbage(make_agent, problem, device)
    check_rebase(make_agent, problem, device)


# ---------------------------------------------------------------- helpers


def _fail(check: str, message: str) -> AssertionError:
    return AssertionError(f"agent conformance [{check}]: {message}")


def _expect(check: str, condition: bool, message: str) -> None:
    if not condition:
        raise _fail(check, message)


def _call(check: str, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, with any exception but AssertionError reported as this check failing."""
    try:
        return fn()
    except AssertionError:
        raise
    except Exception as e:
        raise _fail(check, f"{what} raised {type(e).__name__}: {e}") from e


def reference_solution(problem: Problem, author: str = "conformance") -> Solution:
    """The problem's reference as a one-file pytorch solution (for boards and incumbents)."""
    return Solution.model_validate(
        {
            "name": f"{problem.definition.name}-conformance-reference",
            "definition": problem.definition.name,
            "author": author,
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "reference_copy.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "reference_copy.py", "content": problem.definition.reference}],
        }
    )


def make_context(problem: Problem, device: str, agent: Agent, **fields: Any) -> AgentContext:
    """A rich context: bounds, the agent's own incumbent, another agent's incumbent on the
    board and one conclusion; ``fields`` override."""
    uuids = [w.uuid for w in problem.workloads]
    sol = reference_solution(problem)
    latencies = {u: 1.0 for u in uuids}

    def view(name: str, strategy: str, cid: str, score: float) -> IncumbentView:
        return IncumbentView(
            agent=name,
            strategy=strategy,
            candidate_id=cid,
            score=score,
            latencies_ms=latencies,
            solution=sol,
        )

    mine = view(agent.name, agent.strategy, "c0001-conformance", 1.0)
    other = view("conformance-other", "other", "c0002-conformance", 1.2)
    lesson = Conclusion(
        agent="conformance-other",
        strategy="other",
        candidate_id="c0002-conformance",
        claim="the reference as a solution runs at 1.2x of eager on every workload",
        effect={"all": 1.2},
        tags=("other",),
        outcome="improved",
    )
    values: dict[str, Any] = {
        "problem": problem.definition.name,
        "definition": problem.definition,
        "device": device,
        "bounds_ms": {u: 0.01 for u in uuids},
        "workloads": tuple(dict(w.axes) for w in problem.workloads),
        "incumbent": mine,
        "board": BoardSnapshot(incumbents=(mine, other), version=2),
        "conclusions": (lesson,),
        "budget_left": 10,
        "round": 2,
        "seed": 0,
    }
    return AgentContext(**(values | fields))


def make_result(
    problem: Problem, agent: Agent, proposal: Proposal, kind: str, candidate_id: str
) -> CandidateResult:
    """A constructed verdict of ``kind``: passed, failed, cached, screen or improved."""
    workloads = problem.workloads[:3] if kind == "screen" else problem.workloads
    per = []
    for i, w in enumerate(workloads):
        failed = kind == "failed" and i == 0
        latency = 0.25 if kind == "improved" else 0.5
        per.append(
            WorkloadResult(
                uuid=w.uuid,
                axes=dict(w.axes),
                status="RUNTIME_ERROR" if failed else "PASSED",
                latency_ms=None if failed else latency,
                reference_ms=None if failed else 1.0,
                bound_ms=0.01,
                log=FAIL_LOG if failed else "",
            )
        )
    passed = kind != "failed"
    return CandidateResult(
        candidate_id=candidate_id,
        agent=agent.name,
        strategy=agent.strategy,
        mode=proposal.mode,
        stage="screen" if kind == "screen" else "full",
        per_workload=tuple(per),
        passed=passed,
        score=(4.0 if kind == "improved" else 2.0) if passed else None,
        cached=kind == "cached",
        improved=kind == "improved",
        stopped_early=None if passed else "failed screening",
    )


# ---------------------------------------------------------------- checks


def check_identity(make_agent: AgentFactory, *, listed: bool = True) -> None:
    c = "identity"
    agent = _call(c, "the factory", make_agent)
    _expect(c, isinstance(agent, Agent), f"the factory made a {type(agent).__name__}, not an Agent")
    for attr in ("name", "strategy"):
        value = getattr(agent, attr, None)
        _expect(
            c,
            isinstance(value, str) and bool(value) and value == value.strip() and " " not in value,
            f"{attr} must be a non-empty string without spaces, got {value!r}",
        )
    if listed:
        text = getattr(type(agent), "description", None)
        _expect(
            c,
            isinstance(text, str) and bool(text.strip()) and "\n" not in text and len(text) <= 200,
            f"class attribute 'description' must be one line of at most 200 characters, "
            f"got {text!r}",
        )


def _check_proposal(c: str, problem: Problem, proposal: Any, work: Path) -> None:
    _expect(c, isinstance(proposal, Proposal), f"returned {type(proposal).__name__}, not Proposal")
    sol = proposal.solution
    try:
        again = Solution.model_validate(sol.model_dump(mode="json"))
    except ValueError as e:
        raise _fail(c, f"solution {sol.name!r} does not validate from its JSON: {e}") from e
    _expect(c, again == sol, f"solution {sol.name!r} changes when read back from its JSON")
    _expect(
        c,
        sol.definition == problem.definition.name,
        f"solution {sol.name!r} names definition {sol.definition!r}, "
        f"not {problem.definition.name!r}",
    )
    try:
        choose_builder(sol).build(
            sol, work_dir=work / "work", cache_dir=work / "cache", timeout=120
        )
    except BuildError as e:
        raise _fail(c, f"solution {sol.name!r} does not build: {e}\n{e.log[:2000]}") from e


def check_propose(
    make_agent: AgentFactory,
    problem: Problem,
    device: str = "cpu",
    *,
    max_propose_s: float = DEFAULT_MAX_PROPOSE_S,
) -> None:
    c = "propose"
    agent = _call(c, "the factory", make_agent)
    exempt = bool(getattr(type(agent), "documented_subprocess", False))
    with tempfile.TemporaryDirectory(prefix="kernelarc-agent-conformance-") as tmp:
        for n in range(PROPOSE_CALLS):
            ctx = make_context(problem, device, agent, round=n)
            before = ctx.model_dump(mode="json")
            t0 = time.monotonic()
            proposal = _call(c, f"propose() call {n + 1}", partial(agent.propose, ctx))
            took = time.monotonic() - t0
            _expect(
                c,
                ctx.model_dump(mode="json") == before,
                f"propose() call {n + 1} mutated the context it was given",
            )
            _expect(
                c,
                exempt or took <= max_propose_s,
                f"propose() call {n + 1} took {took:.1f} s (limit {max_propose_s:.0f} s; an "
                "agent that runs a subprocess sets documented_subprocess = True)",
            )
            if proposal is None:
                return
            _check_proposal(c, problem, proposal, Path(tmp) / f"p{n}")


def check_must_draft(make_agent: AgentFactory, problem: Problem, device: str = "cpu") -> None:
    c = "must_draft"
    agent = _call(c, "the factory", make_agent)
    ctx = make_context(problem, device, agent, must_draft=True)
    proposal = _call(c, "propose(must_draft=True)", lambda: agent.propose(ctx))
    if proposal is None:
        return
    _expect(c, isinstance(proposal, Proposal), f"returned {type(proposal).__name__}")
    _expect(
        c,
        proposal.mode == "draft",
        f"asked for a draft, proposed mode {proposal.mode!r} (return a draft or None)",
    )


OBSERVED_KINDS = ("passed", "failed", "cached", "screen", "improved")


def check_observe(make_agent: AgentFactory, problem: Problem, device: str = "cpu") -> None:
    c = "observe"
    outcomes = set(get_args(Outcome))
    for kind in OBSERVED_KINDS:
        agent = _call(c, "the factory", make_agent)
        ctx = make_context(problem, device, agent)
        proposal = _call(c, "propose()", partial(agent.propose, ctx))
        if proposal is None:
            return  # nothing proposed on this device: nothing to observe
        cid = f"c9{OBSERVED_KINDS.index(kind)}-conformance"
        result = make_result(problem, agent, proposal, kind, cid)
        got = _call(c, f"observe({kind})", partial(agent.observe, result))
        where = f"observe({kind})"
        _expect(c, isinstance(got, Conclusion), f"{where} returned {type(got).__name__}")
        try:
            got = Conclusion.model_validate(got.model_dump())
        except ValueError as e:
            raise _fail(c, f"{where}: the conclusion does not validate: {e}") from e
        _expect(
            c,
            (got.agent, got.strategy, got.candidate_id) == (agent.name, agent.strategy, cid),
            f"{where}: conclusion names ({got.agent!r}, {got.strategy!r}, {got.candidate_id!r}),"
            f" want ({agent.name!r}, {agent.strategy!r}, {cid!r})",
        )
        _expect(c, 0 < len(got.claim.strip()) and len(got.claim) <= 300, f"{where}: claim length")
        try:
            check_claim(got)
        except ValueError as e:
            raise _fail(c, f"{where}: {e}") from e
        _expect(c, got.outcome in outcomes, f"{where}: outcome {got.outcome!r}")
        _expect(
            c,
            (got.outcome == "failed") == (not result.passed),
            f"{where}: outcome {got.outcome!r} for a verdict with passed={result.passed}",
        )
        if result.improved:
            _expect(c, got.outcome == "improved", f"{where}: outcome {got.outcome!r}")
        bad = {k: v for k, v in got.effect.items() if not (math.isfinite(v) and v > 0)}
        _expect(c, not bad, f"{where}: effects must be finite and positive, got {bad}")


def _next(agent: Agent, ctx: AgentContext, c: str, what: str) -> str | None:
    proposal = _call(c, what, lambda: agent.propose(ctx))
    return proposal.solution.content_hash() if proposal is not None else None


def check_state(make_agent: AgentFactory, problem: Problem, device: str = "cpu") -> None:
    c = "state"
    agent = _call(c, "the factory", make_agent)
    first = _call(c, "propose()", lambda: agent.propose(make_context(problem, device, agent)))
    if first is not None:
        result = make_result(problem, agent, first, "passed", "c0100-conformance")
        _call(c, "observe()", lambda: agent.observe(result))
    state = _call(c, "state()", agent.state)
    _expect(c, isinstance(state, dict), f"state() returned {type(state).__name__}, not dict")
    try:
        saved = json.loads(json.dumps(state))
    except (TypeError, ValueError) as e:
        raise _fail(c, f"state() is not JSON-serialisable: {e}") from e
    twin = _call(c, "the factory", make_agent)
    _call(c, "restore(state())", lambda: twin.restore(saved))
    ctx = make_context(problem, device, agent, round=1)
    want = _next(agent, ctx, c, "the original's next propose()")
    got = _next(twin, ctx, c, "the restored agent's next propose()")
    _expect(
        c,
        got == want,
        f"a restored agent proposes {got or 'nothing'}, the original {want or 'nothing'} "
        "(content hashes)",
    )


def _garbage(value: Any) -> Any:
    """A value of another JSON type than ``value``. A key that is None now may hold a string
    (or an object) later, so it gets a value no sane field holds: a list nested three deep."""
    if value is None:
        return [[["garbage"]]]
    return {"garbage": [1, 2]} if isinstance(value, str) else "garbage"


def check_restore_rejects_garbage(
    make_agent: AgentFactory, problem: Problem, device: str = "cpu"
) -> None:
    c = "restore_rejects_garbage"
    agent = _call(c, "the factory", make_agent)
    _call(c, "propose()", lambda: agent.propose(make_context(problem, device, agent)))
    state = json.loads(json.dumps(_call(c, "state()", agent.state)))
    for key in sorted(state):
        bad = dict(state) | {key: _garbage(state[key])}
        fresh = _call(c, "the factory", make_agent)
        try:
            fresh.restore(bad)
        except ValueError:
            continue
        except Exception as e:
            raise _fail(
                c, f"restore() with a bad {key!r} raised {type(e).__name__} ({e}), not ValueError"
            ) from e
        raise _fail(c, f"restore() accepted {key!r} = {bad[key]!r}")


__all__ = [
    "OBSERVED_KINDS",
    "check_agent",
    "check_identity",
    "check_must_draft",
    "check_observe",
    "check_propose",
    "check_restore_rejects_garbage",
    "check_state",
    "make_context",
    "make_result",
    "reference_solution",
]


def check_rebase(make_agent: AgentFactory, problem: Problem, device: str = "cpu") -> None:
    c = "rebase"
    agent: Agent = _call(c, "the factory", make_agent)
    if not isinstance(agent, Rebasing):
        return
    empty = make_context(problem, device, agent, board=BoardSnapshot(version=0), incumbent=None)
    proposal = _call(c, "propose() on an empty board", partial(agent.propose, empty))
    if proposal is None:
        return
    ctx = make_context(problem, device, agent)
    before = ctx.model_dump(mode="json")
    new = _call(c, "rebase()", partial(agent.rebase, proposal, ctx))
    _expect(c, ctx.model_dump(mode="json") == before, "rebase() mutated the context it was given")
    if new is not None:
        with tempfile.TemporaryDirectory(prefix="kernelarc-agent-conformance-") as tmp:
            _check_proposal(c, problem, new, Path(tmp))
    state = _call(c, "state() after rebase()", agent.state)
    _call(c, "state() through JSON", lambda: json.loads(json.dumps(state)))
