"""Symmetric timing: the eager reference's latency, the denominator of every speedup, comes
from a candidate worker running the reference solution with the candidate's own request
(docs/GUARD.md, "Symmetric timing").

Covered (CPU): which worker receives which timing request, that both requests are the same
protocol on the same seeds, and the fallback to the reference worker, with a note, when the
reference cannot run as a candidate. The readings themselves (reference / candidate near
1.0): ``benchmarks/self_ratio.py``, too slow and noisy for a test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kernelarc.examples import example_dir
from kernelarc.guard import isolation
from kernelarc.guard.evaluator import Guard, GuardConfig
from kernelarc.guard.messages import Request
from kernelarc.problem.loader import load_problem
from kernelarc.problem.reference import reference_solution

CFG = GuardConfig(device="cpu", rounds=1, warmup=2, iterations=5, warm_spare=False)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    request = isolation.WorkerProcess.request

    def spy(self: isolation.WorkerProcess, msg: Request, timeout: float) -> dict:
        reply = request(self, msg, timeout)
        sent.append({"op": msg.op, "msg": msg, "reply": reply, "role": self.role, "w": self})
        return reply

    monkeypatch.setattr(isolation.WorkerProcess, "request", spy)
    return sent


def test_the_reference_is_timed_in_a_candidate_worker_with_the_candidates_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = _spy(monkeypatch)
    problem = load_problem(example_dir("rmsnorm_h512"))
    solution = reference_solution(problem.definition, agent="test", description="the reference")
    wl = problem.workloads[:2]
    with Guard(problem, CFG) as guard:
        res = guard.evaluate(solution, workloads=wl)
        again = guard.evaluate(solution, workloads=wl[:1])  # cached: no second timing
    assert [t.evaluation and t.evaluation.status.value for t in res.traces] == ["PASSED"] * 2
    assert again.outcomes[0].reference == res.outcomes[0].reference
    timed = [x for x in sent if x["op"] == "time"]
    assert all(x["role"] == "candidate" for x in timed), [x["role"] for x in timed]
    assert len(timed) == 5  # 2 workloads x (candidate, reference), then the candidate alone
    for cand, ref in (timed[0:2], timed[2:4]):
        assert cand["w"] is not ref["w"]
        assert ref["w"] is timed[1]["w"]  # one timer worker for the guard's life
        a, b = cand["msg"].model_dump(), ref["msg"].model_dump()
        assert a.pop("exchange_dir") != b.pop("exchange_dir")
        assert a == b
    for o, ref in zip(res.outcomes, (timed[1], timed[3]), strict=True):
        assert o.reference is not None and o.latency is not None
        assert o.reference["median_ms"] == ref["reply"]["summary"]["median_ms"]
        assert not [n for n in o.notes if "reference timed" in n]


def test_a_reference_that_cannot_run_as_a_candidate_is_timed_in_the_reference_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A reference that reads the problem's own files (the sentinel forbids them to
    candidates) passes as the reference, and is timed in the reference worker, with a note
    saying why."""
    root = tmp_path / "rmsnorm"
    shutil.copytree(example_dir("rmsnorm_h512"), root)
    spec = json.loads((root / "definition.json").read_text())
    spec["reference"] = spec["reference"].replace(
        "    eps = 1e-6\n", f"    open({str(root / 'README.md')!r}).close()\n    eps = 1e-6\n"
    )
    assert "README.md" in spec["reference"]
    (root / "definition.json").write_text(json.dumps(spec))
    sent = _spy(monkeypatch)
    problem = load_problem(root)
    legit = load_problem(example_dir("rmsnorm_h512"))
    solution = reference_solution(legit.definition, agent="test", description="plain RMSNorm")
    with Guard(problem, CFG) as guard:
        res = guard.evaluate(solution, workloads=problem.workloads[:1])
    o = res.outcomes[0]
    assert o.status.value == "PASSED", o.log
    assert o.reference is not None
    notes = [n for n in o.notes if n.startswith("reference timed in the reference worker")]
    assert len(notes) == 1 and "file-access" in notes[0], o.notes
    roles = [x["role"] for x in sent if x["op"] == "time"]
    assert roles == ["candidate", "candidate", "reference"], roles
