"""Tracing references whose Python control flow depends on shapes (``rewrite/trace.py``).

With the workloads known, ``trace_reference`` evaluates conditions, unpacked shapes,
``len``/``int``/``range`` of proxies on meta inputs of every workload and goes on when the
value is the same on all of them. Covered here: an assert on a constant axis (dropped), a
branch every workload takes the same way (specialised), shape unpacking of a var axis, a
loop over a constant axis (unrolled), a condition on a scalar input whose value every
workload gives alike; and the refusals: a branch that differs between workloads, a
condition on a scalar input whose value is not known (its stand-in is not the real value)
or differs, on tensor data, and a loop count that differs between workloads. The traced
graph is run against the reference on real CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

from kernelarc.problem.inputs import load_reference_module
from kernelarc.problem.schema import Definition
from kernelarc.proposers.rewrite.trace import UntraceableError, propagate, trace_reference


def definition(body: str) -> Definition:
    return Definition.model_validate(
        {
            "name": "shape_flow",
            "axes": {"B": {"type": "var"}, "H": {"type": "const", "value": 8}},
            "inputs": {
                "x": {"shape": ["B", "H"], "dtype": "float32"},
                "eps": {"shape": None, "dtype": "float32"},
            },  # fmt: skip
            "outputs": {"y": {"shape": ["B", "H"], "dtype": "float32"}},
            "reference": "import torch\n\ndef run(x, eps):\n"
            + "".join(f"    {line}\n" for line in body.strip().splitlines()),
        }
    )


WORKLOADS = [{"B": 2}, {"B": 5}]


@pytest.mark.parametrize(
    "body",
    [
        "b, h = x.shape\nassert h == 8, 'hidden size'\nreturn x * h + b",
        "if x.dim() == 2:\n    return x * 2\nreturn x",
        "if len(x.shape) != 2:\n    raise ValueError('rank')\nreturn x.reshape(*x.shape) + 1",
        "y = x\nfor i in range(x.shape[1] // 4):\n    y = y + i\nreturn y",
        "return x.T.reshape(*x.T.shape).T * int(x.shape[-1])",
    ],
)
def test_shape_control_flow_is_evaluated_and_the_graph_computes_the_reference(body: str) -> None:
    d = definition(body)
    gm = trace_reference(d, WORKLOADS)
    propagate(gm, d, WORKLOADS)
    ref = load_reference_module(d, name="ref")
    for b in (2, 5):
        x = torch.randn(b, 8)
        torch.testing.assert_close(gm(x, 1e-6), ref.run(x, 1e-6))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("if x.shape[0] > 3:\n    return x * 2\nreturn x", "differs between workloads"),
        ("if eps > 0:\n    return x + eps\nreturn x", "scalar input 'eps'"),
        ("if x.sum() > 0:\n    return x\nreturn -x", "tensor values"),
        ("y = x\nfor _ in range(x.shape[0]):\n    y = y + 1\nreturn y", "differs between"),
    ],
)
def test_what_cannot_be_specialised_stays_untraceable(body: str, why: str) -> None:
    with pytest.raises(UntraceableError, match="torch.fx cannot trace run") as err:
        trace_reference(definition(body), WORKLOADS)
    assert why in str(err.value)


SCALAR_BRANCH = "if eps > 0:\n    return x + eps\nreturn x"


def test_a_condition_on_a_scalar_every_workload_gives_alike_is_specialised() -> None:
    d = definition(SCALAR_BRANCH)
    gm = trace_reference(d, WORKLOADS, [{"eps": 0.5}, {"eps": 0.5}])
    propagate(gm, d, WORKLOADS, [{"eps": 0.5}, {"eps": 0.5}])
    x = torch.randn(2, 8)
    torch.testing.assert_close(gm(x, 0.5), x + 0.5)
    with pytest.raises(UntraceableError, match="differs between workloads"):
        trace_reference(d, WORKLOADS, [{"eps": 0.5}, {"eps": -1.0}])


def test_without_workloads_shape_control_flow_is_untraceable_as_before() -> None:
    with pytest.raises(UntraceableError, match="control flow"):
        trace_reference(definition("assert x.shape[1] == 8\nreturn x"))
