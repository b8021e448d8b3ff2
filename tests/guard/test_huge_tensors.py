"""Problems whose tensors fill most of the GPU (L2 025: 25.8 GB of inputs and as much output
per call): the one-set timing pool, inputs moved one tensor at a time, reference outputs
not cached past their comparison, large files read from kept mappings, and the
CUDA IPC exchange (``guard/cuda_ipc.py``; on the H200 it failed on 2026-12-01 while both
workers ran in PID namespaces of their own, and works since the reference worker runs in
none, 2026-12-02).

CPU: the pool rules, the protocol's header checks, and whole evaluations with a one-set pool
(``GuardConfig.pool_sets=1``), among them a pointer-caching cheat that must still be caught,
and with the one-judged-call regime of outputs that crowd the device (its memory set small).
GPU (skipped without CUDA): a handle exported by another process read back, forged headers
refused, and whole evaluations whose outputs cross over IPC (right and wrong solutions).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernelarc.examples import example_dir
from kernelarc.guard import timing
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.problem.loader import load_problem
from kernelarc.problem.schema import Solution

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
needs_cuda = pytest.mark.gpu


def test_pool_is_one_set_when_a_second_would_take_half_the_free_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(timing, "_host_available", lambda: 100 << 20)
    assert timing.pool_size(60 << 20, 50, cpu) == 1
    assert timing.pool_size(40 << 20, 50, cpu) >= 2
    monkeypatch.setattr(timing, "_host_available", lambda: 0)  # unknown: the old rule
    assert timing.pool_size(600 << 20, 50, cpu) == 2
    assert timing.pool_size(1 << 10, 50, cpu) == 50
    assert timing.pool_size(1 << 10, 50, cpu, cap=3) == 3
    assert timing.pool_size(1 << 10, 50, cpu, cap=1) == 1


def test_two_timed_calls_are_judged_unless_their_outputs_crowd_the_gpu() -> None:
    from kernelarc.guard.footprint import two_calls_crowd

    gib = 1 << 30
    assert not two_calls_crowd(1 << 20, 140 * gib)
    assert two_calls_crowd(24 * gib, 140 * gib)  # L2 025 on the H200
    assert not two_calls_crowd(17 * gib, 140 * gib)  # 34 GiB <= 35 GiB


def test_shifted_moves_every_tensor_and_keeps_values() -> None:
    a, b = torch.arange(10.0), torch.ones(3, 4)
    values = [a, 7, b]
    ptrs = (a.data_ptr(), b.data_ptr())
    out = timing.shifted_values(values, 64)
    assert out is values and out[1] == 7
    assert torch.equal(out[0], torch.arange(10.0)) and torch.equal(out[2], torch.ones(3, 4))
    assert (out[0].data_ptr(), out[2].data_ptr()) != ptrs


def test_ipc_headers_are_refused_off_cuda_and_when_malformed() -> None:
    from kernelarc.guard.cuda_ipc import read_ipc
    from kernelarc.guard.protocol import read_tensor

    header = {"ipc": "00" * 64, "offset": 0, "dtype": "float32", "shape": [4], "nbytes": 16}
    with pytest.raises(ValueError, match="not CUDA"):
        read_tensor(header, "cpu")
    for bad in ({"ipc": "00" * 3}, {"ipc": "zz" * 64}, {"offset": -1}, {"nbytes": 99}):
        with pytest.raises(ValueError):
            read_ipc({**header, **bad}, torch.float32, [4], 16, "cpu")


def _solution(path: Path, name: str, dps: bool = True) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "rmsnorm_h512",
            "author": "test",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": f"{path.name}::run",
                "destination_passing_style": dps,
            },
            "sources": [{"path": path.name, "content": path.read_text()}],
        }
    )


def test_one_set_pool_judges_and_still_catches_pointer_caching() -> None:
    problem = load_problem(example_dir("rmsnorm_h512"))
    cfg = GuardConfig(
        device="cpu", rounds=2, warmup=2, iterations=12, pool_sets=1, warm_spare=False
    )
    legit = _solution(CORPUS / "legit" / "functional_rms_norm.py", "legit")
    cheat = _solution(CORPUS / "evil" / "recheck_data_ptr.py", "cheat")
    wl = problem.workloads[:1]
    with Guard(problem, cfg) as guard:
        res = guard.evaluate(legit, workloads=wl)
        bad = guard.evaluate(cheat, workloads=wl).traces[0].evaluation
    ok = res.traces[0].evaluation
    assert ok is not None and ok.status.value == "PASSED", ok and ok.log
    assert (res.outcomes[0].latency or {}).get("pool") == 1
    assert bad is not None and bad.status.value == "REWARD_HACK", bad and bad.status
    assert bad.log.startswith("REWARD_HACK[recheck]"), bad.log


@pytest.mark.parametrize("memory", [None, 1 << 10], ids=["cpu", "crowded"])
def test_when_two_calls_outputs_crowd_the_device_the_last_alone_is_judged(
    monkeypatch: pytest.MonkeyPatch, memory: int | None
) -> None:
    """The device's memory as the parent reads it (None on the CPU), or 1 KiB, which two
    timed calls' RMSNorm outputs crowd (as L2 025's 24 GiB of gradients crowd an 80 GB
    H100): then the time request says ``one_sample``, the candidate's worker judges its
    last timed call alone, keeps no inputs for the re-check, and is told to let go of its
    outputs before the reference is timed; the reference's timing worker gets the same
    ``one_sample`` and lets go of its outputs after its timing. A legitimate solution passes
    either way; the cheat that replays its last answer is still caught on its last timed
    call."""
    from kernelarc.guard import isolation
    from kernelarc.guard.messages import Request

    monkeypatch.setattr(Guard, "device_memory", memory)
    sent: list[tuple[str, dict]] = []
    request = isolation.WorkerProcess.request

    def spy(self: isolation.WorkerProcess, msg: Request, timeout: float) -> dict:
        reply = request(self, msg, timeout)
        sent.append((msg.op, {"msg": msg, "reply": reply, "role": self.role, "w": self}))
        return reply

    monkeypatch.setattr(isolation.WorkerProcess, "request", spy)
    problem = load_problem(example_dir("rmsnorm_h512"))
    cfg = GuardConfig(device="cpu", rounds=2, warmup=2, iterations=12, warm_spare=False)
    legit = _solution(CORPUS / "legit" / "functional_rms_norm.py", "legit")
    cheat = _solution(CORPUS / "evil" / "recheck_data_ptr.py", "cheat")
    wl = problem.workloads[:1]
    crowded = memory is not None
    with Guard(problem, cfg) as guard:
        ok = guard.evaluate(legit, workloads=wl).traces[0].evaluation
        # the reference is timed in a candidate worker of its own, which then releases too
        timer = {id(x["w"]) for op, x in sent if op == "time" and x["msg"].exchange_dir
                 and x["msg"].exchange_dir.endswith("reference-timing")}  # fmt: skip
        timed = [x for op, x in sent if op == "time" and id(x["w"]) not in timer]
        ref_timed = [x for op, x in sent if op == "time" and id(x["w"]) in timer]
        releases = [op for op, x in sent if op == "release" and id(x["w"]) not in timer]
        sent.clear()
        bad = guard.evaluate(cheat, workloads=wl).traces[0].evaluation
    assert ok is not None and ok.status.value == "PASSED", ok and ok.log
    assert len(timed) == 1 and timed[0]["msg"].one_sample is crowded
    assert len(ref_timed) == 1 and ref_timed[0]["msg"].one_sample is crowded
    assert timed[0]["reply"]["one_sample"] is crowded
    assert len(timed[0]["reply"]["sampled"]) == (1 if crowded else 2)
    assert releases == (["release"] if crowded else [])
    assert bad is not None and bad.status.value == "REWARD_HACK", bad and bad.log
    assert bad.log.startswith("REWARD_HACK[recheck]"), bad.log


# ---------------------------------------------------------------- GPU

_EXPORTER = textwrap.dedent(
    """
    import json, sys, torch
    from kernelarc.guard.cuda_ipc import Exporter
    t = torch.arange({n}, dtype=torch.float32, device="cuda") * 0.5  # as the reader computes
    ex = Exporter()
    print(json.dumps(ex.export(t[{start}:], "float32")), flush=True)
    sys.stdin.readline()
    """
)


@pytest.mark.gpu
@needs_cuda
def test_a_handle_from_another_process_reads_back_and_forgeries_are_refused() -> None:
    from kernelarc.guard.cuda_ipc import IPC_MIN_BYTES, ExchangeUnavailable, read_ipc

    n, start = IPC_MIN_BYTES // 4 + 1024, 256
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXPORTER.format(n=n, start=start)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        header = json.loads(proc.stdout.readline())
        m = n - start
        got = read_ipc(header, torch.float32, [m], 4 * m, "cuda")
        want = (torch.arange(n, dtype=torch.float32, device="cuda") * 0.5)[start:]
        assert torch.equal(got, want)
        with pytest.raises(ValueError, match="allocation holds"):
            read_ipc({**header, "nbytes": 4 * (m + (64 << 20))}, torch.float32,
                     [m + (64 << 20)], 4 * (m + (64 << 20)), "cuda")  # fmt: skip
        with pytest.raises(ExchangeUnavailable):
            read_ipc({**header, "ipc": "ab" * 64}, torch.float32, [m], 4 * m, "cuda")
        proc.stdin.write("\n")
        proc.stdin.flush()
    finally:
        proc.wait(timeout=60)


_BIG = """import torch


def run(x):
    return x * 2.0 + 1.0
"""


def _big_problem(root: Path) -> Path:
    from kernelarc.guard.cuda_ipc import IPC_MIN_BYTES

    d = root / "big_affine"
    d.mkdir()
    definition = {
        "name": "big_affine",
        "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": _BIG,
    }
    (d / "definition.json").write_text(json.dumps(definition))
    wl = {"uuid": "w-big", "axes": {"n": IPC_MIN_BYTES // 4}, "inputs": {"x": {"type": "random"}}}
    (d / "workload.jsonl").write_text(json.dumps(wl) + "\n")
    return d


def _big_solution(body: str, name: str) -> Solution:
    return Solution.model_validate(
        {
            "name": name,
            "definition": "big_affine",
            "author": "test",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": "s.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "s.py", "content": f"import torch\n\n\ndef run(x):\n{body}\n"}],
        }
    )


@pytest.mark.gpu
@needs_cuda
def test_outputs_cross_over_cuda_ipc_right_and_wrong(tmp_path: Path) -> None:
    problem = load_problem(_big_problem(tmp_path))
    cfg = GuardConfig(
        device="cuda", rounds=2, warmup=2, iterations=10, warm_spare=False, gpu_exchange=True
    )
    right = _big_solution("    return torch.add(x, x).add_(1.0)", "ok")
    wrong = _big_solution("    return x * 2.0 + 1.5", "off")
    with Guard(problem, cfg) as guard:
        ok = guard.evaluate(right).traces[0].evaluation
        assert guard.gpu_exchange, "CUDA IPC was turned off: the environment refused it"
        bad = guard.evaluate(wrong).traces[0].evaluation
    assert ok is not None and ok.status.value == "PASSED", ok and ok.log
    assert bad is not None and bad.status.value == "INCORRECT_NUMERICAL", bad and bad.log


@pytest.mark.gpu
@needs_cuda
def test_large_files_are_read_from_a_kept_mapping(tmp_path: Path) -> None:
    from kernelarc.guard.protocol import MAPPED_READ_BYTES, SlotReader, SlotWriter

    n = MAPPED_READ_BYTES // 4
    writer, reader = SlotWriter(), SlotReader()
    try:
        path = tmp_path / "slot0_y.bin"
        for k in (1.0, 2.0):  # the same file written again: the mapping is reused
            t = torch.full((n,), k, device="cuda")
            got = reader.read(writer.write(t, path), "cuda")
            assert torch.equal(got, t)
        writer.close()  # a new worker truncates and re-creates the same file: not stale
        writer = SlotWriter()
        t = torch.full((n,), 3.0, device="cuda")
        assert torch.equal(reader.read(writer.write(t, path), "cuda"), t)
        path.unlink()  # replaced by a new file: read afresh, not from the old mapping
        writer.close()
        writer = SlotWriter()
        t = torch.full((n,), 4.0, device="cuda")
        assert torch.equal(reader.read(writer.write(t, path), "cuda"), t)
        with pytest.raises(ValueError, match="header implies"):
            reader.read({"file": str(path), "dtype": "float32", "shape": [n + 1]}, "cuda")
    finally:
        writer.close()
        reader.close()


@pytest.mark.gpu
@needs_cuda
def test_large_outputs_cross_through_files_when_asked(tmp_path: Path) -> None:
    problem = load_problem(_big_problem(tmp_path))
    cfg = GuardConfig(
        device="cuda", rounds=2, warmup=2, iterations=10, warm_spare=False, gpu_exchange=False
    )
    right = _big_solution("    return torch.add(x, x).add_(1.0)", "ok")
    wrong = _big_solution("    return x * 2.0 + 1.5", "off")
    with Guard(problem, cfg) as guard:
        assert not guard.gpu_exchange
        ok = guard.evaluate(right).traces[0].evaluation
        bad = guard.evaluate(wrong).traces[0].evaluation
        again = guard.evaluate(right).traces[0].evaluation  # a new worker re-creates the files
    assert ok is not None and ok.status.value == "PASSED", ok and ok.log
    assert bad is not None and bad.status.value == "INCORRECT_NUMERICAL", bad and bad.log
    assert again is not None and again.status.value == "PASSED", again and again.log


def test_the_reference_worker_leaves_the_pid_namespace_only_for_cuda_ipc() -> None:
    from types import SimpleNamespace

    from kernelarc.guard.isolation import Isolation

    iso = Isolation(("unshare", "--pid", "--fork"), "pid namespace")
    on, off = (
        SimpleNamespace(gpu_exchange=True, isolation=iso),
        SimpleNamespace(gpu_exchange=False, isolation=iso),
    )
    assert Guard._isolation_of(on, "reference").prefix == ()  # type: ignore[arg-type]
    assert Guard._isolation_of(on, "candidate") is iso  # type: ignore[arg-type]
    assert Guard._isolation_of(off, "reference") is iso  # type: ignore[arg-type]
