"""Generated stand-ins for missing safetensors blobs (``kernelarc.problem.indices``).

Covered: the structural invariants (monotone offsets from 0 to the totals, page indices in
range and distinct, last-page lengths in [1, page_size], kv_len >= qo_len per sequence),
determinism per seed, the notes, the MissingBlobError cases (unknown inputs, no total, a
group half on disk), every workload of the shared problems that read blobs (index tensors
only, nothing else allocated), and the references of the small ones run through the real
guard with the reference as the solution. Not covered here: the references of the > 64 MB
problems (run by ``kernelarc check-problems``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _shared import shared_problems_root

from kernelarc.errors import MissingBlobError
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.axes import resolve_axes
from kernelarc.problem.indices import GENERATED_NOTE, plan_missing_blobs
from kernelarc.problem.inputs import estimate_input_bytes, generate_inputs
from kernelarc.problem.loader import load_problem
from kernelarc.problem.reference import make_solution
from kernelarc.problem.schema import Definition, SafetensorsInput, Workload

BLOB = {"type": "safetensors", "path": "blobs/absent.safetensors"}


def definition(inputs: dict[str, tuple[list[str] | None, str]], axes: dict[str, Any]) -> Definition:
    names = list(inputs)
    return Definition.model_validate(
        {
            "name": "toy",
            "axes": axes,
            "inputs": {n: {"shape": s, "dtype": d} for n, (s, d) in inputs.items()},
            "outputs": {"y": {"shape": [], "dtype": "float32"}},
            "reference": f"def run({', '.join(names)}):\n    return None\n",
        }
    )


def workload(axes: dict[str, int], blobs: list[str]) -> Workload:
    return Workload.model_validate(
        {"uuid": "w0", "axes": axes, "inputs": {b: {**BLOB, "tensor_key": b} for b in blobs}}
    )


def gen(d: Definition, w: Workload, seed: int = 0, root: Path | None = None) -> Any:
    return generate_inputs(d, w, device="cpu", seed=seed, problem_root=root)


VAR = {"type": "var"}
PAGED = definition(
    {
        "q": (["total_q", "h", "d"], "bfloat16"),
        "k_cache": (["num_pages", "page_size", "h", "d"], "bfloat16"),
        "qo_indptr": (["len_indptr"], "int32"),
        "kv_indptr": (["len_indptr"], "int32"),
        "kv_indices": (["num_kv_indices"], "int32"),
        "kv_last_page_len": (["batch_size"], "int32"),
        "sm_scale": (None, "float32"),
    },
    {
        "total_q": VAR,
        "num_pages": VAR,
        "len_indptr": VAR,
        "num_kv_indices": VAR,
        "batch_size": {"type": "expr", "expression": "len_indptr - 1"},
        "page_size": {"type": "const", "value": 4},
        "h": {"type": "const", "value": 2},
        "d": {"type": "const", "value": 8},
    },
)
PAGED_BLOBS = ["qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"]


def check_offsets(t: torch.Tensor, total: int, n: int) -> list[int]:
    vals = t.tolist()
    assert len(vals) == n + 1 and vals[0] == 0 and vals[-1] == total, vals
    assert all(b >= a for a, b in zip(vals, vals[1:], strict=False)), vals
    return [b - a for a, b in zip(vals, vals[1:], strict=False)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_paged_prefill_with_pages_of_four(seed: int) -> None:
    axes = {"total_q": 37, "num_pages": 60, "len_indptr": 6, "num_kv_indices": 25}
    got = gen(PAGED, workload(axes, PAGED_BLOBS), seed=seed)
    v = got.values
    assert [n for n in v] == list(PAGED.inputs)
    assert all(v[n].dtype == torch.int32 for n in PAGED_BLOBS)
    qo = check_offsets(v["qo_indptr"], 37, 5)
    pages = check_offsets(v["kv_indptr"], 25, 5)
    idx = v["kv_indices"].tolist()
    assert len(idx) == 25 and len(set(idx)) == 25 and all(0 <= i < 60 for i in idx)
    last = v["kv_last_page_len"].tolist()
    for q_len, p, lp in zip(qo, pages, last, strict=True):
        assert 1 <= lp <= 4 and p >= 1
        assert (p - 1) * 4 + lp >= q_len, (qo, pages, last)  # causal: kv_len >= qo_len
    head = [n for n in got.notes if n.startswith(GENERATED_NOTE)]
    assert len(head) == 1 and "not read" in head[0], got.notes
    assert any("kv_len >= qo_len" in n for n in got.notes), got.notes
    again = gen(PAGED, workload(axes, PAGED_BLOBS), seed=seed)
    assert all(torch.equal(v[n], again.values[n]) for n in PAGED_BLOBS)
    assert got.notes == again.notes


def test_other_seeds_give_other_structures() -> None:
    axes = {"total_q": 300, "num_pages": 500, "len_indptr": 9, "num_kv_indices": 200}
    a = gen(PAGED, workload(axes, PAGED_BLOBS), seed=1).values
    b = gen(PAGED, workload(axes, PAGED_BLOBS), seed=2).values
    assert not torch.equal(a["kv_indices"], b["kv_indices"])
    assert not torch.equal(a["qo_indptr"], b["qo_indptr"])


def test_totals_that_forbid_causal_lengths_are_noted_and_still_valid() -> None:
    axes = {"total_q": 100, "num_pages": 9, "len_indptr": 5, "num_kv_indices": 3}
    got = gen(PAGED, workload(axes, PAGED_BLOBS))
    pages = check_offsets(got.values["kv_indptr"], 3, 4)
    assert sorted(pages) == [0, 1, 1, 1], pages  # 3 pages for 4 sequences: one is empty
    assert got.values["kv_last_page_len"].tolist()[pages.index(0)] == 0
    text = " ".join(got.notes)
    assert "forbid kv_len >= qo_len" in text and "only 3 of 4 sequences" in text


def test_ragged_offsets_end_at_the_data_tensors_first_axes() -> None:
    d = definition(
        {
            "q": (["nq", "d"], "float32"),
            "k": (["nk", "d"], "float32"),
            "v": (["nk", "d"], "float32"),
            "cu_seqlens_q": (["b1"], "int64"),
            "cu_seqlens_k": (["b1"], "int64"),
            "seq_lens_k": (["b"], "int32"),
        },
        {"nq": VAR, "nk": VAR, "b1": VAR, "b": VAR, "d": {"type": "const", "value": 4}},
    )
    w = workload(
        {"nq": 12, "nk": 40, "b1": 4, "b": 3}, ["cu_seqlens_q", "cu_seqlens_k", "seq_lens_k"]
    )
    v = gen(d, w).values
    qo = check_offsets(v["cu_seqlens_q"], 12, 3)
    kv = check_offsets(v["cu_seqlens_k"], 40, 3)
    assert all(k >= q >= 1 for q, k in zip(qo, kv, strict=True))
    assert v["seq_lens_k"].tolist() == kv and v["seq_lens_k"].dtype == torch.int32


def test_float_blob_inputs_get_random_values_with_a_note() -> None:
    d = definition({"logits": (["t", "e"], "float32"), "bias": (["e"], "bfloat16")},
                   {"t": VAR, "e": {"type": "const", "value": 8}})  # fmt: skip
    got = gen(d, workload({"t": 3}, ["logits", "bias"]))
    assert got.values["logits"].shape == (3, 8) and got.values["bias"].dtype == torch.bfloat16
    assert any(n.startswith(GENERATED_NOTE) for n in got.notes), got.notes
    assert "logits: random values in place of the missing blob" in got.notes


@pytest.mark.parametrize(
    ("inputs", "axes", "blob", "why"),
    [
        ({"block_table": (["b", "m"], "int32")}, {"b": 2, "m": 3}, "block_table", "1-D integer"),
        ({"token_ids": (["n"], "int64")}, {"n": 5}, "token_ids", "no known index structure"),
        ({"kv_indptr": (["n"], "int32")}, {"n": 5}, "kv_indptr", "no total for its last"),
        ({"kv_indices": (["n"], "int32")}, {"n": 5}, "kv_indices", "no *pages* axis"),
        ({"keep": (["n"], "bool")}, {"n": 5}, "keep", "bool input"),
    ],
)
def test_unknown_inputs_keep_raising_with_the_reason(
    inputs: dict[str, tuple[list[str] | None, str]], axes: dict[str, int], blob: str, why: str
) -> None:
    d = definition(inputs, {a: VAR for a in axes})
    with pytest.raises(MissingBlobError) as e:
        gen(d, workload(axes, [blob]), root=Path("/nonexistent-root"))
    msg = str(e.value)
    assert f"input {blob!r}" in msg and "blobs/absent.safetensors" in msg and why in msg, msg
    assert "toy workload w0" in msg and "cannot stand in" in msg


def test_group_half_on_disk_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "blobs").mkdir()
    save_file({"kv_indices": torch.arange(4, dtype=torch.int32)}, tmp_path / "blobs/on.safetensors")
    axes = {"total_q": 4, "num_pages": 10, "len_indptr": 2, "num_kv_indices": 4}
    w = workload(axes, ["qo_indptr", "kv_indptr", "kv_last_page_len"])
    w.inputs["kv_indices"] = SafetensorsInput(path="blobs/on.safetensors", tensor_key="kv_indices")
    with pytest.raises(MissingBlobError, match=r"\['kv_indices'\] of the same index group"):
        gen(PAGED, w, root=tmp_path)


# ---------------------------------------------------------------- the shared problems


def blob_problems() -> list[Path]:
    root = shared_problems_root()
    found = []
    for path in sorted(root.glob("*/*/workload.jsonl")):
        if '"safetensors"' in path.read_text():
            found.append(path.parent)
    assert found, f"no problem under {root} reads safetensors blobs"
    return found


def test_every_blob_workload_of_the_shared_problems_gets_valid_indices() -> None:
    """Index tensors only (plan + generation, no data tensors): every workload, checked
    against what the references assert (offsets end at the totals, indices in range)."""
    checked = 0
    for pdir in blob_problems():
        problem = load_problem(pdir)
        d = problem.definition
        for wl in problem.workloads:
            env = resolve_axes(d, wl)
            missing = {
                n: "absent." for n, s in wl.inputs.items() if isinstance(s, SafetensorsInput)
            }
            plan = plan_missing_blobs(d, env, missing, on_disk=frozenset(), seed=7, where=d.name)
            values = plan._generate()
            for name, t in values.items():
                shape = tuple(env[a] if a in env else int(a) for a in d.inputs[name].shape or [])
                assert tuple(t.shape) == shape, (d.name, name)
            if "kv_indices" in values:
                idx = values["kv_indices"]
                assert idx.numel() == 0 or 0 <= int(idx.min()) <= int(idx.max()) < env["num_pages"]
                assert idx.numel() == torch.unique(idx).numel() or idx.numel() > env["num_pages"]
                check_offsets(values["kv_indptr"], env["num_kv_indices"], env["len_indptr"] - 1)
            if "qo_indptr" in values:
                qo = check_offsets(values["qo_indptr"], env["total_q"], env["len_indptr"] - 1)
                kv = values["kv_indptr"].diff().tolist()
                if sum(kv) >= sum(max(1, q) for q in qo):
                    assert all(k >= q for q, k in zip(qo, kv, strict=True)), (d.name, wl.uuid)
            checked += 1
    assert checked > 100, checked


SMALL_BYTES = 64 << 20


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("guard-cache")


def test_small_blob_problems_run_their_reference_through_the_guard(cache_dir: Path) -> None:
    """The reference as the solution, smallest workload, rounds=1: PASSED on generated
    indices. Problems whose smallest workload exceeds 64 MB of inputs are left to
    ``kernelarc check-problems`` (this CPU is shared)."""
    ran = []
    for pdir in blob_problems():
        problem = load_problem(pdir)
        d = problem.definition
        wl = min(problem.workloads, key=lambda w: estimate_input_bytes(d, w))
        if estimate_input_bytes(d, wl) > SMALL_BYTES:
            continue
        sol = make_solution(d, agent="test", name="ref", description="reference",
                            source=d.reference, entry="run")  # fmt: skip
        config = GuardConfig(device="cpu", rounds=1, warmup=0, iterations=1, timeout=120,
                             warm_spare=False, cache_dir=cache_dir)  # fmt: skip
        with Guard(problem, config) as guard:
            ev = guard.evaluate(sol, [wl])
        trace = ev.traces[0]
        assert trace.evaluation is not None
        status = trace.evaluation.status.value
        assert status == "PASSED", f"{d.name}: {status}\n{trace.evaluation.log[:1500]}"
        ran.append(d.name)
    assert len(ran) >= 3, ran
    print(json.dumps(ran))


def test_more_indices_than_pages_are_distinct_per_sequence() -> None:
    axes = {"total_q": 3, "num_pages": 5, "len_indptr": 4, "num_kv_indices": 12}
    v = gen(PAGED, workload(axes, PAGED_BLOBS), seed=5).values
    pages = check_offsets(v["kv_indptr"], 12, 3)
    idx, start = v["kv_indices"].tolist(), 0
    assert len(idx) == 12 and all(0 <= i < 5 for i in idx)
    for p in pages:
        seq = idx[start : start + p]
        assert len(set(seq)) == min(p, 5) or p > 5, (pages, idx)
        start += p
