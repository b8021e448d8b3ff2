"""Problems whose reference writes an input in place (a KV-cache update: L1 018 writes
`key_cache`/`value_cache` and returns them). The guard lets a candidate write (and return)
exactly the inputs the reference itself writes, and no others, whether it finds writes by
copies or by fingerprints. Before, the reference
itself was judged REWARD_HACK (input-mutation) on such a problem: nothing could pass."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Solution

REFERENCE = """import torch

def run(x, cache):
    y = x * 2
    cache[: x.shape[0]] = y
    return y, cache
"""

DEFINITION = {
    "name": "ka_cache_update",
    "description": "y = 2x, written into the first rows of a cache in place (test problem)",
    "op_type": "test",
    "axes": {
        "n": {"type": "var"},
        "c": {"type": "const", "value": 16},
        "d": {"type": "const", "value": 8},
    },
    "inputs": {
        "x": {"shape": ["n", "d"], "dtype": "float32"},
        "cache": {"shape": ["c", "d"], "dtype": "float32"},
    },
    "outputs": {
        "y": {"shape": ["n", "d"], "dtype": "float32"},
        "cache_out": {"shape": ["c", "d"], "dtype": "float32"},
    },
    "reference": REFERENCE,
}

# Writes the input the reference writes, in place, and returns it: allowed.
IN_PLACE = REFERENCE
# Leaves the inputs alone and returns a new cache: allowed (and slower).
CLONED = """import torch

def run(x, cache):
    out = cache.clone()
    out[: x.shape[0]] = x * 2
    return x * 2, out
"""
# Also scales x in place: the reference never writes x.
WRITES_X = """import torch

def run(x, cache):
    x.mul_(2)
    cache[: x.shape[0]] = x
    return x.clone(), cache
"""
# Returns x itself (aliased) as y: the reference never returns x.
RETURNS_X = """import torch

def run(x, cache):
    cache[: x.shape[0]] = x * 2
    x.data = x * 2
    return x, cache
"""


def _solution(name: str, code: str) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "ka_cache_update",
            "author": "test",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "m.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "m.py", "content": code}],
        }
    )


@pytest.fixture(scope="module", params=[256 << 20, 0], ids=["copied", "fingerprinted"])
def guard(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Guard]:
    """Inputs copied to find writes (the default for small tensors), and fingerprinted
    (``copy_bytes=0``: what tensors of 256 MiB or more get, ``guard/call_checks.py``)."""
    root = tmp_path_factory.mktemp("cache_update")
    (root / "definition.json").write_text(json.dumps(DEFINITION))
    rows = [{"uuid": f"cache-n{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"},
             "cache": {"type": "random"}}} for n in (2, 5)]  # fmt: skip
    (root / "workload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = GuardConfig(
        device="cpu", warmup=1, iterations=3, cache_dir=root / "cache", copy_bytes=request.param
    )
    with Guard(load_problem(root), config) as g:
        yield g


def _statuses(guard: Guard, code: str, name: str) -> tuple[list[str], str]:
    result = guard.evaluate(_solution(name, code))
    logs = "\n".join(t.evaluation.log for t in result.traces if t.evaluation)
    return [t.evaluation.status.value for t in result.traces if t.evaluation], logs


@pytest.mark.parametrize("name,code", [("in_place", IN_PLACE), ("cloned", CLONED)])
def test_writing_what_the_reference_writes_passes(guard: Guard, name: str, code: str) -> None:
    statuses, logs = _statuses(guard, code, name)
    assert statuses == ["PASSED", "PASSED"], logs


def test_writing_another_input_is_a_reward_hack(guard: Guard) -> None:
    statuses, logs = _statuses(guard, WRITES_X, "writes_x")
    assert statuses and all(s == "REWARD_HACK" for s in statuses), logs
    assert "input-mutation" in logs and "input x was modified" in logs, logs


def test_returning_another_input_is_a_reward_hack(guard: Guard) -> None:
    statuses, logs = _statuses(guard, RETURNS_X, "returns_x")
    assert statuses and all(s == "REWARD_HACK" for s in statuses), logs
    assert "input-mutation" in logs or "output-aliases-input" in logs, logs
