"""The post-timing re-check with inputs that are Python scalars (a custom input generator
returning a float that changes with the seed, as the NVFP4 problems' global scales do).

The re-check writes fresh tensor values into the buffers of the last timed call; a scalar
has no buffer, so it must take the fresh value too. Before 2026-12-01 it kept the last timed
call's value and correct candidates were judged ``REWARD_HACK[recheck]``.
"""

from __future__ import annotations

import json
from pathlib import Path

from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Solution

REFERENCE = """import torch


def make_inputs(axes_and_scalars, device):
    n = axes_and_scalars["n"]
    x = torch.randn(n, 8, device=device)
    return {"x": x, "scale": float(torch.rand(()).item() * 4 + 1)}


def run(x, scale):
    return x * scale
"""


def _problem(root: Path) -> Path:
    d = root / "scalar_scale"
    d.mkdir()
    definition = {
        "name": "scalar_scale",
        "axes": {"n": {"type": "var"}, "d": {"type": "const", "value": 8}},
        "inputs": {
            "x": {"shape": ["n", "d"], "dtype": "float32"},
            "scale": {"shape": None, "dtype": "float32"},
        },
        "outputs": {"out": {"shape": ["n", "d"], "dtype": "float32"}},
        "reference": REFERENCE,
        "custom_inputs_entrypoint": "make_inputs",
    }
    (d / "definition.json").write_text(json.dumps(definition))
    wl = {
        "uuid": "w-scalar",
        "axes": {"n": 16},
        "inputs": {"x": {"type": "custom"}, "scale": {"type": "custom"}},
    }
    (d / "workload.jsonl").write_text(json.dumps(wl) + "\n")
    return d


def test_scalars_take_fresh_values_at_the_recheck(tmp_path: Path) -> None:
    problem = load_problem(_problem(tmp_path))
    sol = Solution.model_validate(
        {
            "name": "scale-ok",
            "definition": "scalar_scale",
            "author": "test",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "s.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "s.py", "content": "def run(x, scale):\n    return x * scale\n"}],
        }
    )
    cfg = GuardConfig(device="cpu", rounds=2, warmup=1, iterations=3, warm_spare=False)
    with Guard(problem, cfg) as guard:
        res = guard.evaluate(sol)
    ev = res.traces[0].evaluation
    assert ev is not None
    assert ev.status.value == "PASSED", ev.log
