"""Workloads too large for the device's memory in the guard are named before anything is
judged (``guard/footprint.py``): sizes from the declared shapes of an expert-weights problem
shaped like L2 025 (nothing is allocated), against the memory of an 80 GB and a 141 GB card;
and nothing on the CPU."""

from __future__ import annotations

from kernelarc.guard.footprint import GIB, device_warnings, guard_need_bytes, memory_warnings
from kernelarc.problem.schema import Definition, Workload

H100 = int(79.18 * GIB)
H200 = int(139.8 * GIB)
EXPERTS = ["n_experts", "inter", "hidden"]


def _moe_backward() -> Definition:
    """Three float32 expert weights of 256 x 2048 x 4096 (8 GiB each) in, their three
    gradients out, beside token-sized tensors."""
    tokens = ["num_tokens", "hidden"]
    return Definition.model_validate(
        {
            "name": "moe_backward_like",
            "axes": {
                "num_tokens": {"type": "var"},
                "hidden": {"type": "const", "value": 4096},
                "inter": {"type": "const", "value": 2048},
                "n_experts": {"type": "const", "value": 256},
            },
            "inputs": {
                "grad_output": {"shape": tokens, "dtype": "float32"},
                "gate": {"shape": EXPERTS, "dtype": "float32"},
                "up": {"shape": EXPERTS, "dtype": "float32"},
                "down": {"shape": EXPERTS, "dtype": "float32"},
            },
            "outputs": {
                "grad_hidden": {"shape": tokens, "dtype": "float32"},
                "grad_gate": {"shape": EXPERTS, "dtype": "float32"},
                "grad_up": {"shape": EXPERTS, "dtype": "float32"},
                "grad_down": {"shape": EXPERTS, "dtype": "float32"},
            },
            "reference": "def run(grad_output, gate, up, down):\n    raise NotImplementedError\n",
        }
    )


def _workload(uuid: str, tokens: int) -> Workload:
    return Workload.model_validate({"uuid": uuid, "axes": {"num_tokens": tokens}, "inputs": {}})


def test_the_count_is_the_inputs_plus_twice_the_outputs() -> None:
    ins, outs, need = guard_need_bytes(_moe_backward(), _workload("w2048", 2048))
    token_bytes = 2048 * 4096 * 4
    assert ins == outs == 3 * (8 << 30) + token_bytes
    assert need == ins + 2 * outs
    assert 72.0 < need / GIB < 72.2  # L2 025's case


def test_an_80_gb_card_is_warned_of_and_a_141_gb_card_is_not() -> None:
    definition = _moe_backward()
    workloads = [_workload("w0128", 128), _workload("w2048", 2048), _workload("w16384", 16384)]
    (line,) = memory_warnings(definition, workloads, H100)  # none fits: one line
    assert line.startswith("all 3 workloads are too large, or close to it, for the device's ")
    assert "79.2 GiB in the guard: in the smallest, w0128 (num_tokens=128), its" in line
    assert "inputs (24.0 GiB)" in line and "use a device with more memory" in line
    assert memory_warnings(definition, workloads, H200) == []
    (small,) = memory_warnings(definition, workloads, int(70 * GIB))
    assert small.startswith("all 3 workloads are too large for the device's 70.0 GiB")
    # on a 96 GiB card only the largest are named, largest first, the rest counted
    many = [_workload(f"w{t}", t) for t in (128, 1 << 20, 2 << 20, 3 << 20, 4 << 20)]
    lines = memory_warnings(definition, many, int(96 * GIB))
    assert [x.split(" (")[0] for x in lines[:3]] == [
        "workload w4194304",
        "workload w3145728",
        "workload w2097152",
    ]
    assert "leave it out with --workloads '!w4194304'" in lines[0] and "cannot fit" in lines[0]
    assert lines[3] == "... and 1 more of the 5 workloads"


def test_the_cpu_gets_no_warning() -> None:
    definition = _moe_backward()
    assert device_warnings(definition, [_workload("w2048", 2048)], "cpu") == []
