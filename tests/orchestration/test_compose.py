"""Shape-gated composition (``kernelarc.orchestration.compose``) on the bundled example
``rmsnorm_h512`` (CPU).

Covered: three different PyTorch RMSNorm implementations (destination passing; returning its
result; multi-file with a helper package) composed into one solution that validates, builds
with the real builder and passes the real guard on every workload; routing observed
in-process through the dispatcher's lazy module cache and a per-implementation call log
(winner shapes go to their winner, an unseen shape to the default); the generated
dispatcher's imports; :func:`axis_locator` for input, output and scalar axes; every
CompositionError case (C++ part, same dispatch key with different winners,
colliding module names, unknown workload, other definition).

Not covered: Triton parts on a GPU (the dispatcher treats them like any Python part).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelarc.examples import example_dir
from kernelarc.guard.build import choose_builder, load_entry
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.orchestration.compose import (
    CompositionError,
    axis_locator,
    compose,
    dispatch_key,
)
from kernelarc.problem.loader import Problem, load_problem, load_solution
from kernelarc.problem.schema import Definition, Solution, Workload

EXAMPLE_DIR = example_dir("rmsnorm_h512")
HELPER_PKG = "ka_compose_test_lib"

DPS_SRC = """\
import torch

CALLS = []


@torch.no_grad()
def run(hidden_states, weight, output):
    CALLS.append(hidden_states.shape[0])
    x = hidden_states.to(torch.float32)
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    output.copy_(x * inv * weight.to(torch.float32))
"""

RETURNING_SRC = """\
import torch

CALLS = []


@torch.no_grad()
def run(hidden_states, weight):
    CALLS.append(hidden_states.shape[0])
    x = hidden_states.to(torch.float32)
    y = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.to(torch.float32), eps=1e-6)
    return y.to(hidden_states.dtype)
"""

MULTI_ENTRY_SRC = f"""\
import torch
from {HELPER_PKG}.core import inverse_rms

CALLS = []


@torch.no_grad()
def run(hidden_states, weight, output):
    CALLS.append(hidden_states.shape[0])
    x = hidden_states.to(torch.float32)
    torch.mul(x * inverse_rms(x), weight.to(torch.float32), out=x)
    output.copy_(x)
"""

HELPER_SRC = """\
import torch


def inverse_rms(x):
    return 1.0 / torch.sqrt((x * x).sum(dim=-1, keepdim=True) / x.shape[-1] + 1e-6)
"""


def _solution(name: str, files: dict[str, str], entry: str, *, dps: bool = True) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "ka_rmsnorm_h512",
            "author": "test",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": entry,
                "destination_passing_style": dps,
            },
            "sources": [{"path": p, "content": c} for p, c in files.items()],
        }
    )


def dps_solution() -> Solution:
    return _solution("rms_dps", {"rms.py": DPS_SRC}, "rms.py::run")


def returning_solution() -> Solution:
    return _solution("rms_returning", {"rms.py": RETURNING_SRC}, "rms.py::run", dps=False)


def multi_solution(helper: str = HELPER_SRC, name: str = "rms_multi") -> Solution:
    files = {
        "entry.py": MULTI_ENTRY_SRC,
        f"{HELPER_PKG}/__init__.py": "",
        f"{HELPER_PKG}/core.py": helper,
    }
    return _solution(name, files, "entry.py::run")


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(EXAMPLE_DIR)


def _winners(problem: Problem) -> dict[str, Solution]:
    """b1, b3 -> returning; b16, b64 -> multi-file; b128 -> the default itself; b257 none."""
    wl = problem.workloads
    ret, multi = returning_solution(), multi_solution()
    return {
        wl[0].uuid: ret,
        wl[1].uuid: ret,
        wl[2].uuid: multi,
        wl[3].uuid: multi,
        wl[4].uuid: dps_solution(),
    }


@pytest.fixture(scope="module")
def composed(problem: Problem) -> Solution:
    return compose(problem.definition, problem.workloads, _winners(problem), default=dps_solution())


@pytest.fixture
def restore_import_state(tmp_path: Path) -> Iterator[None]:
    """Undo what loading a solution staged under ``tmp_path`` does to sys.path and
    sys.modules (libraries the solutions imported stay loaded)."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if name.startswith("ka_sol_") or file.startswith(str(tmp_path)):
            del sys.modules[name]


# ---------------------------------------------------------------- the composed solution


def test_layout_spec_and_description(problem: Problem, composed: Solution) -> None:
    assert Solution.model_validate_json(composed.model_dump_json()) == composed
    assert composed.spec.entry_point == "dispatch.py::run"
    assert composed.spec.destination_passing_style is True
    assert [lang.value for lang in composed.spec.languages] == ["pytorch"]
    assert sorted(s.path for s in composed.sources) == [
        "dispatch.py",
        "impl_0/rms.py",  # the default (also b128's winner: deduplicated)
        "impl_1/rms.py",
        "impl_2/entry.py",
        f"impl_2/{HELPER_PKG}/__init__.py",
        f"impl_2/{HELPER_PKG}/core.py",
    ]
    assert composed.description is not None
    for part in ("impl_0 = rms_dps", "impl_1 = rms_returning", "impl_2 = rms_multi"):
        assert part in composed.description
    dispatch = next(s.content for s in composed.sources if s.path == "dispatch.py")
    for i, wl in enumerate(problem.workloads[:5]):
        impl = {0: 1, 1: 1, 2: 2, 3: 2, 4: 0}[i]
        assert f"batch_size={wl.axes['batch_size']} -> impl_{impl}: {wl.uuid}" in dispatch
    assert problem.workloads[5].uuid not in dispatch  # no winner: served by the default
    imported = set()
    for node in ast.walk(ast.parse(dispatch)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"torch", "importlib", "pathlib", "sys"}


def test_guard_passes_composed_solution(problem: Problem, composed: Solution, tmp_path: Path):
    config = GuardConfig(device="cpu", warmup=1, iterations=3, cache_dir=tmp_path / "cache")
    with Guard(problem, config) as g:
        res = g.evaluate(composed)
    logs = [t.evaluation.log[:300] for t in res.traces if t.evaluation is not None]
    assert len(res.traces) == len(problem.workloads)
    assert res.all_passed, logs


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()


def test_dispatch_routes_by_shape(
    composed: Solution, tmp_path: Path, restore_import_state: None
) -> None:
    art = choose_builder(composed).build(
        composed, work_dir=tmp_path / "work", cache_dir=tmp_path / "cache", timeout=60
    )
    run = load_entry(art)
    dispatcher: Any = sys.modules[art.module_name]
    assert dispatcher._LOADED == {}  # lazy: nothing imported before the first call
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(512, generator=gen).bfloat16()
    expected_calls: dict[int, list[int]] = {0: [], 1: [], 2: []}
    # 3, 1: returning impl_1; 64: multi-file impl_2; 5 (no workload): default; 128: default
    for batch, impl in [(3, 1), (64, 2), (1, 1), (5, 0), (128, 0)]:
        x = torch.randn(batch, 512, generator=gen).bfloat16()
        out = torch.full((batch, 512), float("nan"), dtype=torch.bfloat16)
        assert run(x, weight, out) is None
        expected_calls[impl].append(batch)
        torch.testing.assert_close(out, _reference(x, weight), atol=2e-2, rtol=2e-2)
        assert set(dispatcher._LOADED) == {k for k, v in expected_calls.items() if v}
        for k, module in dispatcher._LOADED.items():
            assert module.CALLS == expected_calls[k]
    # the multi-file part's helper is its own file, and its folder left sys.path again
    helper = sys.modules[f"{HELPER_PKG}.core"]
    assert Path(helper.__file__).parent.parent.name == "impl_2"
    assert not any(Path(p).name.startswith("impl_") for p in sys.path)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        run(torch.zeros(1, 512).bfloat16(), weight)


def test_no_winners_routes_everything_to_default(
    problem: Problem, tmp_path: Path, restore_import_state: None
) -> None:
    """Every part returns its outputs: so does the composed solution (no output copy)."""
    sol = compose(problem.definition, problem.workloads, {}, default=returning_solution())
    assert "(empty: every shape goes to impl_0)" in sol.sources[0].content
    assert sol.spec.destination_passing_style is False
    art = choose_builder(sol).build(
        sol, work_dir=tmp_path / "w", cache_dir=tmp_path / "c", timeout=60
    )
    run = load_entry(art)
    x, w = torch.randn(2, 512).bfloat16(), torch.ones(512).bfloat16()
    out = run(x, w)
    torch.testing.assert_close(out, _reference(x, w), atol=2e-2, rtol=2e-2)
    assert list(sys.modules[art.module_name]._LOADED) == [0]
    with pytest.raises(TypeError, match="takes 2 arguments, got 3"):
        run(x, w, torch.empty_like(x))


# ---------------------------------------------------------------- axis_locator


def _definition(axes: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any]):
    params = ", ".join(inputs)
    return Definition.model_validate(
        {
            "name": "ka_compose_test_def",
            "axes": axes,
            "inputs": inputs,
            "outputs": outputs,
            "reference": f"def run({params}):\n    return None\n",
        }
    )


def test_axis_locator_inputs_outputs_scalars(problem: Problem) -> None:
    assert axis_locator(problem.definition) == {"batch_size": ("input", 0, 0)}
    f32 = "float32"
    d = _definition(
        {
            "n": {"type": "var"},
            "m": {"type": "var"},
            "k": {"type": "var"},
            "h": {"type": "const", "value": 4},
        },
        {"k": {"shape": None, "dtype": "int64"}, "x": {"shape": ["h", "n"], "dtype": f32}},
        {"y": {"shape": ["n", "m"], "dtype": f32}},
    )
    # inputs preferred (n is also in the output), then outputs, then a same-named scalar
    assert axis_locator(d) == {"n": ("input", 1, 1), "m": ("output", 0, 1), "k": ("scalar", 0, -1)}
    wl = Workload(uuid="w1", axes={"n": 3, "m": 5, "k": 7})
    sol = _solution("s", {"a.py": "def run(k, x, y):\n    pass\n"}, "a.py::run")
    sol = sol.model_copy(update={"definition": d.name})
    dispatch = compose(d, [wl], {"w1": sol}, default=sol).sources[0].content
    assert "_TABLE.get((args[1].shape[1], args[2].shape[1], args[0]), _DEFAULT)" in dispatch
    assert "(3, 5, 7): 0," in dispatch


def test_var_axes_only_in_expressions_dispatch_on_the_expression_axes() -> None:
    """batch and seq enter the shapes only through tokens = batch * seq: the dispatcher
    reads tokens, and (1, 256) and (2, 128) are one call to it."""
    d = _definition(
        {
            "batch": {"type": "var"},
            "seq": {"type": "var"},
            "tokens": {"type": "expr", "expression": "batch * seq"},
            "h": {"type": "const", "value": 4},
        },
        {"x": {"shape": ["tokens", "h"], "dtype": "float32"}},
        {"y": {"shape": ["tokens", "h"], "dtype": "float32"}},
    )
    assert axis_locator(d) == {"tokens": ("input", 0, 0)}
    wls = [
        Workload(uuid="a", axes={"batch": 1, "seq": 256}),
        Workload(uuid="b", axes={"batch": 2, "seq": 128}),
        Workload(uuid="c", axes={"batch": 2, "seq": 256}),
    ]
    assert [dispatch_key(d, w) for w in wls] == [(256,), (256,), (512,)]
    sol = _solution("s", {"a.py": "def run(x, y):\n    pass\n"}, "a.py::run")
    sol = sol.model_copy(update={"definition": d.name})
    other = _solution("t", {"b.py": "def run(x, y):\n    y.zero_()\n"}, "b.py::run")
    other = other.model_copy(update={"definition": d.name})
    dispatch = compose(d, wls, {"a": sol, "b": sol, "c": other}, default=sol)
    text = dispatch.sources[0].content
    assert "_TABLE.get((args[0].shape[0],), _DEFAULT)" in text
    assert "(256,): 0,  # a, b" in text and "(512,): 1,  # c" in text
    with pytest.raises(CompositionError, match="same dispatch axes.*different winners"):
        compose(d, wls, {"a": sol, "b": other}, default=sol)


def test_no_readable_axis_gives_one_dispatch_key() -> None:
    d = _definition(
        {
            "n": {"type": "var"},
            "n2": {"type": "expr", "expression": "n * 2"},
            "h": {"type": "const", "value": 4},
        },
        {"x": {"shape": ["h"], "dtype": "float32"}},
        {"y": {"shape": ["h"], "dtype": "float32"}},
    )
    assert axis_locator(d) == {}
    assert dispatch_key(d, Workload(uuid="a", axes={"n": 3})) == ()


# ---------------------------------------------------------------- refusals


def test_cpp_part_is_refused(problem: Problem) -> None:
    cuda = load_solution(EXAMPLE_DIR / "solution_cuda.json")
    uuid = problem.workloads[0].uuid
    with pytest.raises(CompositionError, match=f"{cuda.name}.*cuda_cpp"):
        compose(problem.definition, problem.workloads, {uuid: cuda}, default=dps_solution())
    with pytest.raises(CompositionError, match="default solution"):
        compose(problem.definition, problem.workloads, {}, default=cuda)


def test_same_shape_different_winners_is_refused(problem: Problem) -> None:
    first = problem.workloads[0]
    twin = first.model_copy(update={"uuid": "twin-of-b1"})
    wls = [*problem.workloads, twin]
    ok = compose(
        problem.definition,
        wls,
        {first.uuid: returning_solution(), twin.uuid: returning_solution()},
        default=dps_solution(),
    )
    assert f"{first.uuid}, twin-of-b1" in ok.sources[0].content
    with pytest.raises(CompositionError, match="same dispatch axes.*different winners"):
        compose(
            problem.definition,
            wls,
            {first.uuid: returning_solution(), twin.uuid: multi_solution()},
            default=dps_solution(),
        )


def test_colliding_module_names(problem: Problem) -> None:
    wl = problem.workloads
    other = multi_solution(helper=HELPER_SRC + "\nEXTRA = 1\n", name="rms_multi_b")
    with pytest.raises(CompositionError, match=f"module named '{HELPER_PKG}'"):
        compose(
            problem.definition,
            wl,
            {wl[0].uuid: multi_solution(), wl[1].uuid: other},
            default=dps_solution(),
        )
    # identical helper files are shared; only the entries differ
    same = multi_solution(name="rms_multi_c")
    same.sources[0] = same.sources[0].model_copy(
        update={"content": MULTI_ENTRY_SRC + "\nVERSION = 2\n"}
    )
    sol = compose(
        problem.definition,
        wl,
        {wl[0].uuid: multi_solution(), wl[1].uuid: same},
        default=dps_solution(),
    )
    cores = sorted(s.path for s in sol.sources if s.path.endswith("/core.py"))
    assert cores == [f"impl_1/{HELPER_PKG}/core.py", f"impl_2/{HELPER_PKG}/core.py"]


def test_unknown_workload_and_other_definition(problem: Problem) -> None:
    with pytest.raises(CompositionError, match="not among the 6 workloads"):
        compose(
            problem.definition, problem.workloads, {"nope": dps_solution()}, default=dps_solution()
        )
    foreign = dps_solution().model_copy(update={"definition": "something_else"})
    with pytest.raises(CompositionError, match="for definition 'something_else'"):
        compose(problem.definition, problem.workloads, {}, default=foreign)


def test_finish_routes_each_dispatch_key_to_its_fastest_candidate() -> None:
    """Workloads (1, 256) and (2, 128) are one dispatch key: both go to the candidate with
    the lower geomean over the two (B: 1 and 4 ms vs A: 3 and 3 ms), although A is faster
    on one of them; (2, 256) goes to its own fastest (A)."""
    from kernelarc.agents.types import CandidateResult, WorkloadResult
    from kernelarc.orchestration.finish import winners
    from kernelarc.store.base import CandidateRecord, EvaluationRecord

    d = _definition(
        {
            "batch": {"type": "var"},
            "seq": {"type": "var"},
            "tokens": {"type": "expr", "expression": "batch * seq"},
        },
        {"x": {"shape": ["tokens"], "dtype": "float32"}},
        {"y": {"shape": ["tokens"], "dtype": "float32"}},
    )
    wls = [
        Workload(uuid="a", axes={"batch": 1, "seq": 256}),
        Workload(uuid="b", axes={"batch": 2, "seq": 128}),
        Workload(uuid="c", axes={"batch": 2, "seq": 256}),
    ]
    sol = _solution("s", {"a.py": "def run(x, y):\n    pass\n"}, "a.py::run")

    def passed(cid: str, ms: dict[str, float]) -> tuple[CandidateRecord, EvaluationRecord]:
        per = tuple(
            WorkloadResult(uuid=u, axes={}, status="PASSED", latency_ms=v, reference_ms=10.0)
            for u, v in ms.items()
        )
        result = CandidateResult(
            candidate_id=cid,
            agent=cid,
            strategy="s",
            mode="refine",
            stage="full",
            per_workload=per,
            passed=True,
            score=1.0,
        )
        rec = CandidateRecord(
            id=cid, content_hash=cid, agent=cid, strategy="s", mode="refine", solution=sol
        )
        return rec, EvaluationRecord(candidate_id=cid, stage="full", result=result)

    passes = [
        passed("A", {"a": 3.0, "b": 3.0, "c": 1.0}),
        passed("B", {"a": 1.0, "b": 4.0, "c": 2.0}),
    ]
    got = {u: rec.id for u, rec in winners(d, wls, passes).items()}
    assert got == {"a": "B", "b": "B", "c": "A"}


def test_predicted_gain_of_routing_each_workload_to_its_winner(problem: Problem) -> None:
    from kernelarc.orchestration.compose import predicted_gain

    d, wls = problem.definition, problem.workloads
    same = {"A": {w.uuid: 1.0 for w in wls}, "B": {w.uuid: 1.0 for w in wls}}
    assert predicted_gain(d, wls, same) == pytest.approx(1.0)
    halves = {
        "A": {w.uuid: 1.0 if i % 2 else 4.0 for i, w in enumerate(wls)},
        "B": {w.uuid: 4.0 if i % 2 else 1.0 for i, w in enumerate(wls)},
    }
    # the best single is 4x slower on half the workloads: sqrt(4)
    assert predicted_gain(d, wls, halves) == pytest.approx(2.0)
    partial = {"A": same["A"], "B": {wls[0].uuid: 0.1}}  # B missed workloads: not routed
    assert predicted_gain(d, wls, partial) == pytest.approx(1.0)
