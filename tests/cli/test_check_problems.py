"""``kernelarc check-problems``: the CLI end to end in a subprocess over a small tree.

The tree (built in tmp_path, every reference tiny): the bundled rmsnorm example (L1, runs),
a paged-decode toy whose index blobs are missing (generated: runs, noted), a reference that
raises NotImplementedError "not supported", one whose blob cannot be generated, one that
hangs (time limit), one whose only workload needs terabytes (skipped before running), and
one whose definition does not load. Checked: JSON field names, status, category and reason
per problem, exit codes 0/1/2, the table and its per-subset summary, and the sample
selection. Not covered: CUDA devices, out-of-memory kills (the CPU machine is shared).
The two surveys of the tree run at once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from _shared import started_ahead

from kernelarc.guard.survey import classify, select_workloads
from kernelarc.problem.schema import Definition, Workload

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "kernelarc" / "examples" / "rmsnorm_h512"
VAR = {"type": "var"}
DECODE_REF = """import torch

def run(q, k_cache, kv_indptr, kv_indices):
    assert kv_indptr.shape[0] == q.shape[0] + 1
    assert int(kv_indptr[-1]) == kv_indices.shape[0]
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        rows = k_cache[kv_indices[kv_indptr[b]:kv_indptr[b + 1]].long()]
        if rows.shape[0]:
            out[b] = torch.softmax(rows @ q[b], 0) @ rows
    return out
"""


def write(root: Path, subset: str, name: str, definition: dict[str, Any],
          workloads: list[dict[str, Any]]) -> None:  # fmt: skip
    d = root / subset / name
    d.mkdir(parents=True)
    (d / "definition.json").write_text(json.dumps({"name": name, **definition}))
    (d / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in workloads))


def simple(reference: str, n: int = 4) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    definition = {
        "axes": {"n": VAR},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": reference,
    }
    return definition, [{"uuid": f"w-{n}", "axes": {"n": n}, "inputs": {}}]


def blob(key: str) -> dict[str, str]:
    return {"type": "safetensors", "path": "blobs/absent.safetensors", "tensor_key": key}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("problems")
    shutil.copytree(EXAMPLE, root / "L1" / "rmsnorm")
    decode = {
        "axes": {"batch": VAR, "num_pages": VAR, "len_indptr": VAR, "num_kv_indices": VAR,
                 "d": {"type": "const", "value": 8}},
        "inputs": {"q": {"shape": ["batch", "d"], "dtype": "float32"},
                   "k_cache": {"shape": ["num_pages", "d"], "dtype": "float32"},
                   "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
                   "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"}},
        "outputs": {"out": {"shape": ["batch", "d"], "dtype": "float32"}},
        "reference": DECODE_REF,
    }  # fmt: skip
    axes = {"batch": 3, "num_pages": 40, "len_indptr": 4, "num_kv_indices": 20}
    write(root, "FlashInfer-Bench", "toy_decode", decode,
          [{"uuid": "d0", "axes": axes, "inputs": {"kv_indptr": blob("kv_indptr"),
                                                   "kv_indices": blob("kv_indices")}}])  # fmt: skip
    write(
        root,
        "Quant",
        "toy_unsupported",
        *simple("def run(x):\n    raise NotImplementedError('fp4 matmul not supported here')\n"),
    )
    ids = {"axes": {"n": VAR}, "inputs": {"token_ids": {"shape": ["n"], "dtype": "int64"}},
           "outputs": {"y": {"shape": ["n"], "dtype": "int64"}},
           "reference": "def run(token_ids):\n    return token_ids\n"}  # fmt: skip
    write(
        root,
        "FlashInfer-Bench",
        "toy_blob",
        ids,
        [{"uuid": "b0", "axes": {"n": 4}, "inputs": {"token_ids": blob("token_ids")}}],
    )
    write(root, "L2", "toy_hang", *simple("import time\n\ndef run(x):\n    time.sleep(600)\n"))
    write(root, "L2", "toy_huge", *simple("def run(x):\n    return x\n", n=10**12))
    (root / "L2" / "toy_broken").mkdir()
    (root / "L2" / "toy_broken" / "definition.json").write_text("{not json")
    (root / "L2" / "toy_broken" / "workload.jsonl").write_text('{"uuid": "x"}\n')
    return root


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kernelarc.cli.main", "check-problems", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


EXPECTED = {  # name -> (status, category, a fragment of the reason)
    "ka_rmsnorm_h512": ("ok", None, None),
    "toy_decode": ("ok", None, None),
    "toy_unsupported": ("failed", "unsupported_op", "NotImplementedError"),
    "toy_blob": ("failed", "missing_blob", "token_ids"),
    "toy_hang": ("failed", "timeout", "time limit of 8 s"),
    "toy_huge": ("failed", "skipped", "skipped: needs 24000.0 GB"),
    "toy_broken": ("failed", "load_error", "definition.json"),
}


@pytest.fixture(scope="module")
def surveys(
    request: pytest.FixtureRequest, tree: Path
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """The two surveys of the tree, started together (``_shared``'s ``started_ahead``):
    nothing they check comes near the 8 s limit but the hanging reference (the slowest
    other step, the bounds helper's start, takes ~2 s alone)."""
    jobs: dict[str, Callable[[], subprocess.CompletedProcess[str]]] = {
        "test_json_over_a_small_tree": partial(
            cli, str(tree), "--device", "cpu", "--workloads", "smallest", "--json",
            "--timeout", "8",
        ),
        "test_table_of_one_subset": partial(
            cli, str(tree), "--device", "cpu", "--subset", "L1", "--workloads", "sample"
        ),
    }  # fmt: skip
    yield from started_ahead(request, jobs)


def test_json_over_a_small_tree(
    surveys: dict[str, Future[subprocess.CompletedProcess[str]]],
) -> None:
    proc = surveys["test_json_over_a_small_tree"].result()
    assert proc.returncode == 1, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    by_name = {r["name"]: r for r in results}
    assert set(by_name) == set(EXPECTED), sorted(by_name)
    for name, (status, category, fragment) in EXPECTED.items():
        r = by_name[name]
        assert {"name", "subset", "status", "reason", "workloads"} <= set(r), r
        assert (r["status"], r["category"]) == (status, category), (name, r)
        if fragment is None:
            assert r["reason"] is None
        else:
            assert fragment in r["reason"], (name, r["reason"])
    assert by_name["toy_decode"]["subset"] == "FlashInfer-Bench"
    for name in ("ka_rmsnorm_h512", "toy_decode"):
        (w,) = by_name[name]["workloads"]
        assert {"uuid", "axes", "status", "reason", "reference_ms", "bound_ms", "notes"} <= set(w)
        assert w["status"] == "ok" and w["reason"] is None
        assert (w["reference_ms"] or 0) > 0 and (w["bound_ms"] or 0) > 0, (name, w)
    notes = by_name["toy_decode"]["workloads"][0]["notes"]
    assert any(n.startswith("generated inputs") for n in notes), notes
    assert by_name["toy_huge"]["workloads"][0]["status"] == "skipped"
    assert "FlashInfer-Bench: 1/2 ok" in proc.stderr and "7 problems, 2 ok" in proc.stderr


def test_table_of_one_subset(
    surveys: dict[str, Future[subprocess.CompletedProcess[str]]],
) -> None:
    proc = surveys["test_table_of_one_subset"].result()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ka_rmsnorm_h512" in proc.stdout and "3/3" in proc.stdout
    assert "Summary by subset" in proc.stdout and "toy_" not in proc.stdout


def test_usage_errors(tree: Path) -> None:
    """Exit code 2 before any survey (after the surveys: nothing beside them while they
    run, whose steps must stay within their time limit)."""
    for bad in (["--workloads", "some"], ["--device", "tpu"], ["--subset", "L9"]):
        got = cli(str(tree), *bad)
        assert got.returncode == 2, (bad, got.stdout[-500:], got.stderr[-500:])
    assert cli(str(tree / "nowhere")).returncode == 2


def test_sample_is_smallest_median_largest() -> None:
    d = Definition.model_validate(json.loads((EXAMPLE / "definition.json").read_text()))
    wls = [Workload(uuid=f"u{b}", axes={"batch_size": b}) for b in (7, 1, 64, 3, 16)]
    picked = [wl.uuid for wl, _ in select_workloads(d, wls, "sample")]
    assert picked == ["u1", "u7", "u64"]
    assert [wl.uuid for wl, _ in select_workloads(d, wls, "smallest")] == ["u1"]
    assert len(select_workloads(d, wls, "all")) == 5


@pytest.mark.parametrize(
    ("message", "category"),
    [
        ("RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul", "unsupported_op"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB", "out_of_memory"),
        ("RuntimeError: DefaultCPUAllocator: can't allocate memory", "out_of_memory"),
        (
            "MissingBlobError: input 'x' reads safetensors file a.st, which is absent",
            "missing_blob",
        ),
        ("AssertionError: Torch not compiled with CUDA enabled", "unsupported_op"),
        ("AssertionError: shapes differ", "other"),
    ],
)
def test_classify(message: str, category: str) -> None:
    assert classify(message) == category
