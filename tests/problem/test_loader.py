"""Tests of kernelarc.problem.loader and discover: the shared problems load, and broken files
give errors naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _shared import shared_problems_root

from kernelarc.errors import ProblemLoadError
from kernelarc.problem.discover import find_problems, summarize
from kernelarc.problem.loader import (
    SUBSETS,
    load_definition,
    load_problem,
    load_solution,
    load_workloads,
)

REFERENCE = "def run(x, n_scale):\n    return x * n_scale\n"


def definition_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "toy_scale",
        "axes": {
            "n": {"type": "var"},
            "d": {"type": "const", "value": 8},
            "half": {"type": "expr", "expression": "n / 2"},
        },
        "inputs": {
            "x": {"shape": ["n", "d"], "dtype": "float32"},
            "n_scale": {"shape": None, "dtype": "float32"},
        },
        "outputs": {"y": {"shape": ["n", "d"], "dtype": "bfloat16"}},
        "reference": REFERENCE,
    }
    data.update(changes)
    return data


def workload_line(uuid: str, n: int = 4, **changes: Any) -> str:
    data: dict[str, Any] = {
        "uuid": uuid,
        "axes": {"n": n},
        "inputs": {"x": {"type": "random"}, "n_scale": {"type": "scalar", "value": 2.0}},
    }
    data.update(changes)
    return json.dumps(data)


def write_problem(
    directory: Path, lines: list[str] | None = None, definition: dict[str, Any] | None = None
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "definition.json").write_text(json.dumps(definition or definition_data()))
    if lines is None:
        lines = [workload_line(f"uuid-{i}", n=2 * (i + 1)) for i in range(3)]
    (directory / "workload.jsonl").write_text("\n".join(lines) + "\n")
    return directory


# ---------------------------------------------------------------- the shared problems


@pytest.fixture(scope="module")
def shared_dirs() -> list[Path]:
    return find_problems(shared_problems_root())


def test_every_shared_problem_loads(shared_dirs: list[Path]) -> None:
    root = shared_problems_root()
    assert len(shared_dirs) == len(list(root.glob("**/definition.json")))
    for directory in shared_dirs:
        problem = load_problem(directory)
        lines = (directory / "workload.jsonl").read_text().splitlines()
        raw = [json.loads(x) for x in lines if x.strip()]
        assert [w.uuid for w in problem.workloads] == [r["uuid"] for r in raw]
        assert problem.subset in SUBSETS
        spelled = sum(1 for r in raw if "required_match_ratio" in (r.get("tolerance") or {}))
        noted = [n for n in problem.notes if "required_match_ratio" in n]
        assert noted == (
            [
                f"{spelled} workloads spell required_match_ratio; ignored as the "
                "official harness does, 0.99 enforced"
            ]
            if spelled
            else []
        )
        assert all(
            w.tolerance.required_matched_ratio == 0.99
            for w in problem.workloads
            if "required_match_ratio" in w.tolerance.ignored_keys
        )


def test_shared_summaries_have_no_error(shared_dirs: list[Path]) -> None:
    for directory in shared_dirs:
        summary = summarize(directory)
        assert summary.error is None, summary.error
        assert summary.workloads > 0 and summary.dtypes == sorted(summary.dtypes)


# ---------------------------------------------------------------- workload errors


def broken(tmp_path: Path, bad: str, line_no: int = 7) -> ProblemLoadError:
    """A workload file whose line ``line_no`` is ``bad``; blank lines count as lines."""
    good = [workload_line(f"ok-{i}") for i in range(line_no - 2)]
    lines = [*good, "", bad]  # a blank line just before the bad one
    directory = write_problem(tmp_path / "p", lines)
    with pytest.raises(ProblemLoadError) as info:
        load_problem(directory)
    return info.value


@pytest.mark.parametrize(
    ("inputs", "axes", "field", "words"),
    [
        ({"x": {"type": "bogus"}}, {"n": 4}, "inputs.x.type", "'bogus'"),
        ({"x": {}}, {"n": 4}, "inputs.x.type", "discriminator"),
        ({"n_scale": {"type": "scalar"}}, {"n": 4}, "inputs.n_scale.value", "Field required"),
        ({"zz": {"type": "random"}}, {"n": 4}, "inputs.zz", "not an input of toy_scale"),
        (
            {"x": {"type": "custom"}, "n_scale": {"type": "custom"}},
            {"n": 4},
            "inputs",
            "custom_inputs_entrypoint",
        ),
        ({}, {}, "axes", "var axis 'n' has no value"),
        ({}, {"n": -3}, "axes.n", "greater than or equal to 0"),
        ({}, {"n": 5}, "axes", "5/2 is not an integer"),
        ({}, {"n": 4, "d": 16}, "axes.d", "definition gives 8"),
    ],
)
def test_workload_errors_name_file_line_field(
    tmp_path: Path, inputs: dict[str, Any], axes: dict[str, int], field: str, words: str
) -> None:
    err = broken(tmp_path, json.dumps({"uuid": "bad-1", "axes": axes, "inputs": inputs}))
    assert f"workload.jsonl:7 (field {field}): " in str(err)
    assert words in str(err)
    assert (err.line, err.field) == (7, field)


def test_invalid_json_line(tmp_path: Path) -> None:
    err = broken(tmp_path, '{"uuid": "a", "axes": {"n": 4},}', line_no=3)
    assert "workload.jsonl:3: invalid JSON at column 32: Expecting property name" in str(err)


def test_non_object_line_and_duplicate_uuid(tmp_path: Path) -> None:
    assert "expected a JSON object per line, found an array" in str(broken(tmp_path, "[1, 2]"))
    err = broken(tmp_path, workload_line("ok-0"))
    assert "workload.jsonl:7 (field uuid): duplicate uuid ok-0 (first on line 1)" in str(err)


def test_empty_workload_file(tmp_path: Path) -> None:
    directory = write_problem(tmp_path / "p", ["", "  "])
    with pytest.raises(ProblemLoadError, match="holds no workloads"):
        load_problem(directory)


def test_load_workloads_directly_and_notes(tmp_path: Path) -> None:
    tol = {"max_atol": 0.5, "required_match_ratio": 0.5}
    lines = [workload_line("a", tolerance=tol), "", workload_line("b"), workload_line("c", n=6)]
    directory = write_problem(tmp_path / "p", lines)
    definition = load_definition(directory / "definition.json")
    workloads = load_workloads(directory / "workload.jsonl", definition)
    assert [w.axes["n"] for w in workloads] == [4, 4, 6]
    assert workloads[0].tolerance.max_atol == 0.5
    assert workloads[0].tolerance.required_matched_ratio == 0.99
    assert load_problem(directory).notes[0].startswith("1 workloads spell required_match_ratio")


# ---------------------------------------------------------------- definition errors


def test_definition_errors(tmp_path: Path) -> None:
    d = tmp_path / "p"
    write_problem(d)
    (d / "definition.json").write_bytes(b'{"name": "x",\n "description": "caf\xe9"}')
    with pytest.raises(ProblemLoadError, match=r"definition.json:2: not UTF-8"):
        load_problem(d)
    (d / "definition.json").write_text('{"name": "x",\n  "axes": }')
    with pytest.raises(ProblemLoadError, match=r"definition.json:2: invalid JSON at line 2"):
        load_problem(d)
    (d / "definition.json").write_text("[1]")
    with pytest.raises(ProblemLoadError, match="expected a JSON object, found an array"):
        load_problem(d)
    bad_axis = definition_data(axes={"n": {"type": "variable"}, "d": {"type": "var"}})
    (d / "definition.json").write_text(json.dumps(bad_axis))
    with pytest.raises(ProblemLoadError, match=r"\(field axes.n.type\): Input tag 'variable'"):
        load_problem(d)
    wrong_run = definition_data(reference="def run(n_scale, x):\n    return x\n")
    (d / "definition.json").write_text(json.dumps(wrong_run))
    with pytest.raises(ProblemLoadError, match=r"definition.json: reference: run\('n_scale'"):
        load_problem(d)
    (d / "definition.json").write_text(json.dumps(definition_data(reference="")))
    with pytest.raises(ProblemLoadError, match=r"\(field reference\): no reference source"):
        load_problem(d)


def test_reference_py_fallback_and_mismatch_note(tmp_path: Path) -> None:
    d = write_problem(tmp_path / "p", definition=definition_data(reference=""))
    (d / "reference.py").write_text(REFERENCE)
    problem = load_problem(d)
    assert problem.definition.reference == REFERENCE
    assert "definition.json has no reference; using reference.py" in problem.notes
    (d / "reference.py").write_text("def run(x, n_scale):\n    return x\n")
    (d / "definition.json").write_text(json.dumps(definition_data()))
    problem = load_problem(d)
    assert problem.definition.reference == REFERENCE
    assert any("differs from reference.py; using definition.json" in n for n in problem.notes)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ProblemLoadError, match="does not exist"):
        load_problem(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ProblemLoadError, match="holds definition.json and workload.jsonl"):
        load_problem(empty)
    write_problem(tmp_path / "tree" / "L1" / "a")
    with pytest.raises(ProblemLoadError, match="looks like a tree of problems"):
        load_problem(tmp_path / "tree")
    d = write_problem(tmp_path / "p")
    (d / "workload.jsonl").unlink()
    with pytest.raises(ProblemLoadError, match=r"workload.jsonl: missing beside definition.json"):
        load_problem(d / "definition.json")


def test_subset_and_metadata(tmp_path: Path) -> None:
    d = write_problem(tmp_path / "Quant" / "toy")
    problem = load_problem(d / "definition.json")
    assert (problem.subset, problem.metadata, problem.root) == ("Quant", None, d)
    other = write_problem(tmp_path / "mine" / "toy")
    (other / "metadata.json").write_text(json.dumps({"subset": "L2", "num_workloads": 5}))
    problem = load_problem(other)
    assert problem.subset == "L2" and problem.metadata == {"subset": "L2", "num_workloads": 5}
    assert any("counts 5 workloads" in n for n in problem.notes)
    (other / "metadata.json").write_text("{")
    with pytest.raises(ProblemLoadError, match="metadata.json:1: invalid JSON"):
        load_problem(other)


def test_broken_problem_summary_keeps_definition_facts(tmp_path: Path) -> None:
    d = write_problem(tmp_path / "L1" / "dir_name", [workload_line("a", n=3)])
    summary = summarize(d)
    assert summary.error is not None and "workload.jsonl:1 (field axes)" in summary.error
    assert (summary.name, summary.subset, summary.workloads) == ("toy_scale", "L1", 0)
    assert summary.axes == {"n": "var", "d": "const=8", "half": "expr: n / 2"}
    assert summary.dtypes == ["bfloat16", "float32"]
    (d / "definition.json").write_text("nope")
    summary = summarize(d)
    assert summary.name == "dir_name" and "invalid JSON" in (summary.error or "")


# ---------------------------------------------------------------- selecting workloads


def test_workload_selection(tmp_path: Path) -> None:
    lines = [workload_line(u) for u in ("abc-1", "abd-2", "xyz-3", "7")]
    problem = load_problem(write_problem(tmp_path / "p", lines))
    assert problem.workload(1).uuid == "abd-2"
    assert problem.workload("2").uuid == "xyz-3"
    assert problem.workload("7").uuid == "7"  # an exact uuid wins over an index
    assert problem.workload("xy").uuid == "xyz-3"
    picked = problem.select(["abc", "0,2", "abd-2"])
    assert [w.uuid for w in picked] == ["abc-1", "xyz-3", "abd-2"]
    with pytest.raises(ProblemLoadError, match="'ab' is ambiguous; it matches abc-1, abd-2"):
        problem.select(["ab"])
    with pytest.raises(ProblemLoadError, match=r"no workload matches 'q'.*0=abc-1, 1=abd-2"):
        problem.select(["q"])
    with pytest.raises(ProblemLoadError, match=r"index 9 is out of range; there are 4"):
        problem.workload(9)
    # "!" leaves a workload out: of all of them, or of those named
    assert [w.uuid for w in problem.select(["!1"])] == ["abc-1", "xyz-3", "7"]
    assert [w.uuid for w in problem.select(["!abd, !xy"])] == ["abc-1", "7"]
    assert [w.uuid for w in problem.select(["2,0", "!xyz"])] == ["abc-1"]
    with pytest.raises(ProblemLoadError, match="no workload matches 'q'"):
        problem.select(["!q"])
    with pytest.raises(ProblemLoadError, match="leave none to judge"):
        problem.select(["!0,!1,!2,!3"])


# ---------------------------------------------------------------- solutions


def solution_data(sources: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "name": "toy_sol",
        "definition": "toy_scale",
        "author": "tests",
        "spec": {"languages": ["triton"], "entry_point": "kernel.py::run", **spec},
        "sources": sources,
    }


def test_solution_sources_inline_and_in_files(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "kernel.py").write_text("def run(x, n_scale, y):\n    y.copy_(x)\n")
    (tmp_path / "pkg" / "util.py").write_text("K = 1\n")
    sources = [{"path": "kernel.py"}, {"path": "pkg/util.py"}, {"path": "c.py", "content": "C"}]
    (tmp_path / "solution.json").write_text(json.dumps(solution_data(sources)))
    solution = load_solution(tmp_path)
    contents = {s.path: s.content for s in solution.sources}
    assert contents == {
        "kernel.py": "def run(x, n_scale, y):\n    y.copy_(x)\n",
        "pkg/util.py": "K = 1\n",
        "c.py": "C",
    }
    assert solution.spec.entry_symbol == "run"


def test_solution_errors(tmp_path: Path) -> None:
    path = tmp_path / "solution.json"
    path.write_text(json.dumps(solution_data([{"path": "kernel.py"}])))
    with pytest.raises(ProblemLoadError) as info:
        load_solution(path)
    assert "(field sources[0].content)" in str(info.value)
    assert str(tmp_path / "kernel.py") in str(info.value)
    path.write_text(json.dumps(solution_data([{"path": "../kernel.py"}])))
    with pytest.raises(ProblemLoadError, match=r"\(field sources\[0\].path\): source path"):
        load_solution(path)
    path.write_text(json.dumps(solution_data([{"path": "other.py", "content": "x"}])))
    with pytest.raises(ProblemLoadError, match="entry file 'kernel.py' is not among the sources"):
        load_solution(path)
    path.write_text(
        json.dumps(
            solution_data(
                [{"path": "kernel.py", "content": "x"}], languages=["pytorch", "cuda_cpp"]
            )
        )
    )
    with pytest.raises(ProblemLoadError, match="mix the Python group and the C"):
        load_solution(path)
    (tmp_path / "kernel.py").write_bytes(b"\xff\xfe")
    path.write_text(json.dumps(solution_data([{"path": "kernel.py"}])))
    with pytest.raises(ProblemLoadError, match=r"kernel.py:1: not UTF-8"):
        load_solution(path)
