"""The bundled example problems (src/kernelarc/examples) load, validate and are right.

Covered: every example definition/workload file validates with the schema and loads with
``load_problem``; every ``solution_*.json`` validates as ``Solution`` (directly and through
``load_solution``); on CPU the PyTorch solutions, the TF32 GEMM solution and the Triton
solution (under ``TRITON_INTERPRET=1``) agree with the reference on random inputs of every
workload, judged with the official tolerance rule. The CUDA C++ solution is built and
checked only where CUDA is available (``gpu`` marker).

Not covered: the guard (see test_corpus.py), input generation by ``kernelarc.problem.inputs``
(inputs here are plain seeded randn), timing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch

from kernelarc.errors import KernelArcError
from kernelarc.examples import EXAMPLES_DIR, example_dir, example_names, example_solutions
from kernelarc.problem.axes import resolve_axes, resolve_shape
from kernelarc.problem.schema import Definition, Solution, Tolerance, Workload

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
EXPECTED_EXAMPLES = {"rmsnorm_h512": "ka_rmsnorm_h512", "gemm_small": "ka_gemm_fp32"}


def _definition(name: str) -> Definition:
    return Definition.model_validate_json((example_dir(name) / "definition.json").read_text())


def _workload_rows(name: str) -> list[dict]:
    lines = (example_dir(name) / "workload.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _module_from_source(source: str, path: Path) -> types.ModuleType:
    """Import ``source`` as a fresh module from a real file (Triton's jit needs one)."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inputs(definition: Definition, workload: Workload, seed: int) -> dict[str, torch.Tensor]:
    env = resolve_axes(definition, workload)
    gen = torch.Generator().manual_seed(seed)
    values = {}
    for name, spec in definition.inputs.items():
        shape = resolve_shape(spec.shape, env)
        assert shape is not None, f"{definition.name}.{name}: examples have no scalar inputs"
        values[name] = torch.randn(shape, generator=gen).to(_DTYPES[spec.dtype.value])
    return values


def _assert_within(name: str, got: torch.Tensor, want: torch.Tensor, tol: Tolerance) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, name
    x, y = got.float(), want.float()
    assert torch.isfinite(x).all(), f"{name}: NaN/Inf in the solution's output"
    matched = ((x - y).abs() <= tol.max_atol + tol.max_rtol * y.abs()).float().mean().item()
    assert matched >= tol.required_matched_ratio, f"{name}: matched ratio {matched:.4f}"


def _check_solution_against_reference(problem: str, solution_file: str, tmp_path: Path) -> None:
    definition = _definition(problem)
    solution = Solution.model_validate_json((example_dir(problem) / solution_file).read_text())
    entry = next(s for s in solution.sources if s.path == solution.spec.entry_file)
    reference = _module_from_source(definition.reference, tmp_path / "reference_mod.py")
    candidate = _module_from_source(entry.content, tmp_path / f"cand_{Path(entry.path).stem}.py")
    run = getattr(candidate, solution.spec.entry_symbol)
    for row in _workload_rows(problem):
        workload = Workload.model_validate(row)
        for seed in (0, 1):
            inputs = _inputs(definition, workload, seed)
            want = reference.run(*inputs.values())
            out = torch.empty_like(want)
            assert solution.spec.destination_passing_style
            run(*inputs.values(), out)
            _assert_within(f"{solution.name} on {workload.uuid}", out, want, workload.tolerance)


# ---------------------------------------------------------------- files and schema


def test_bundled_examples_are_listed() -> None:
    assert set(EXPECTED_EXAMPLES) <= set(example_names())
    assert example_dir("rmsnorm_h512") == EXAMPLES_DIR / "rmsnorm_h512"
    with pytest.raises(KernelArcError, match="pick one of"):
        example_dir("no_such_example")


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_definition_and_workloads_validate(name: str) -> None:
    definition = _definition(name)
    assert definition.name == EXPECTED_EXAMPLES[name]
    rows = _workload_rows(name)
    workloads = [Workload.model_validate(r) for r in rows]
    assert len({w.uuid for w in workloads}) == len(workloads), "workload uuids must be unique"
    for w in workloads:
        env = resolve_axes(definition, w)
        for spec in [*definition.inputs.values(), *definition.outputs.values()]:
            assert all(d > 0 for d in resolve_shape(spec.shape, env) or ())
    with_tol = [r for r in rows if "tolerance" in r]
    assert with_tol and len(with_tol) < len(rows), "some lines carry a tolerance, some not"
    for row, w in zip(rows, workloads, strict=True):
        if "tolerance" in row:
            for key, value in row["tolerance"].items():
                assert getattr(w.tolerance, key) == value
        else:
            assert w.tolerance == Tolerance()
    assert len((example_dir(name) / "README.md").read_text().splitlines()) == 3


@pytest.mark.parametrize("name", sorted(EXPECTED_EXAMPLES))
def test_load_problem(name: str) -> None:
    from kernelarc.problem.loader import load_problem

    problem = load_problem(example_dir(name))
    assert problem.definition == _definition(name)
    assert [w.uuid for w in problem.workloads] == [r["uuid"] for r in _workload_rows(name)]
    assert Path(problem.root).resolve() == example_dir(name).resolve()


@pytest.mark.parametrize(
    "path",
    [p for n in sorted(EXPECTED_EXAMPLES) for p in example_solutions(n)],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_solution_files_validate(path: Path) -> None:
    from kernelarc.problem.loader import load_solution

    solution = Solution.model_validate_json(path.read_text())
    assert solution.definition == _definition(path.parent.name).name
    assert solution.spec.destination_passing_style
    assert load_solution(path) == solution
    if solution.spec.is_cpp:
        source = next(s.content for s in solution.sources if s.path == solution.spec.entry_file)
        assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in source
        assert 'm.def("run"' in source


def test_every_example_has_a_pytorch_solution() -> None:
    for name in EXPECTED_EXAMPLES:
        langs = {
            lang.value
            for p in example_solutions(name)
            for lang in Solution.model_validate_json(p.read_text()).spec.languages
        }
        assert "pytorch" in langs, name


# ---------------------------------------------------------------- numbers (CPU)


@pytest.mark.parametrize(
    "problem,solution_file",
    [("rmsnorm_h512", "solution_pytorch.json"), ("gemm_small", "solution_pytorch.json")],
)
def test_pytorch_solution_matches_reference(
    problem: str, solution_file: str, tmp_path: Path
) -> None:
    _check_solution_against_reference(problem, solution_file, tmp_path)


def test_tf32_solution_matches_reference_on_cpu(tmp_path: Path) -> None:
    tf32 = torch.backends.cuda.matmul.allow_tf32
    precision = torch.get_float32_matmul_precision()
    try:
        _check_solution_against_reference("gemm_small", "solution_tf32.json", tmp_path)
        assert torch.backends.cuda.matmul.allow_tf32, "the module must switch TF32 on at import"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.set_float32_matmul_precision(precision)


def test_triton_solution_interpreted_on_cpu() -> None:
    """Triton reads TRITON_INTERPRET when it is imported, so this runs in a fresh process."""
    pytest.importorskip("triton")
    script = (
        "import sys, tests.cli.test_examples as t\n"
        "t._check_solution_against_reference("
        "'rmsnorm_h512', 'solution_triton.json', __import__('pathlib').Path(sys.argv[1]))\n"
        "print('triton-ok')\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-c", script, tmp],
            cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "TRITON_INTERPRET": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0 and "triton-ok" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- CUDA (GPU only)


@pytest.mark.gpu
def test_cuda_solution_builds_and_matches_reference(tmp_path: Path) -> None:
    from torch.utils.cpp_extension import load_inline

    definition = _definition("rmsnorm_h512")
    path = example_dir("rmsnorm_h512") / "solution_cuda.json"
    solution = Solution.model_validate_json(path.read_text())
    options = solution.spec.compile_options
    assert options is not None
    ext = load_inline(
        "ka_example_rmsnorm_cuda",
        cpp_sources="",
        cuda_sources=solution.sources[0].content,
        extra_cflags=options.cflags,
        extra_cuda_cflags=options.cuda_cflags,
        build_directory=str(tmp_path),
    )
    reference = _module_from_source(definition.reference, tmp_path / "reference_mod.py")
    for row in _workload_rows("rmsnorm_h512"):
        workload = Workload.model_validate(row)
        inputs = {k: v.cuda() for k, v in _inputs(definition, workload, 0).items()}
        want = reference.run(*inputs.values())
        out = torch.empty_like(want)
        ext.run(*inputs.values(), out)
        torch.cuda.synchronize()
        _assert_within(f"cuda on {workload.uuid}", out, want, workload.tolerance)
