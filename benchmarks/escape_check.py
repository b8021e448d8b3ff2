"""The stream-escape check end to end, on a GPU machine.

    python benchmarks/escape_check.py

Judges ``tests/corpus/evil/stream_escape_side_stream.py`` (work left on a side stream the
call never joins) on the bundled ``rmsnorm_h512`` example through the full guard, with CUPTI
and with CUDA events, and prints the verdict and the timing summary (the median, and the
second series the escape check compares: caller-stream events or host wall time). Then the
same ``run`` under ``time_calls`` in this process, with the guard's warm-up, count and
extension settings, so a difference between the two paths shows.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelarc.examples import example_dir  # noqa: E402
from kernelarc.guard.evaluator import Guard, GuardConfig  # noqa: E402
from kernelarc.problem.loader import load_problem  # noqa: E402
from kernelarc.problem.schema import Solution  # noqa: E402

CORPUS = ROOT / "tests" / "corpus" / "evil" / "stream_escape_side_stream.py"


def through_guard(cupti: str) -> None:
    ex = load_problem(example_dir("rmsnorm_h512"))
    sol = Solution.model_validate(
        {
            "name": CORPUS.stem,
            "definition": ex.definition.name,
            "author": "corpus",
            "spec": {
                "languages": ["pytorch"],
                "entry_point": f"{CORPUS.name}::run",
                "destination_passing_style": True,
            },
            "sources": [{"path": CORPUS.name, "content": CORPUS.read_text()}],
        }
    )
    cfg = GuardConfig(device="cuda", timeout=60, warmup=2, iterations=5, cupti=cupti)
    with Guard(ex, cfg) as guard:
        res = guard.evaluate(sol, list(ex.workloads[:2]))
    for t, o in zip(res.traces, res.outcomes, strict=True):
        ev = t.evaluation
        assert ev is not None
        print(f"guard cupti={cupti}: {ev.status.value} check={o.check} latency={o.latency}")
        print(f"   log: {ev.log[:300]!r}")


def in_process() -> None:
    import torch

    from kernelarc.guard.timing import time_calls

    spec = importlib.util.spec_from_file_location("escape_case", CORPUS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(7, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    for cupti in (True, False):
        r = time_calls(
            lambda i: mod.run(x, w, out),
            lambda i: out.fill_(float("nan")),
            warmup=2,
            iterations=5,
            device=torch.device("cuda"),
            use_cupti=cupti,
            min_timed_ms=10.0,
            max_iterations=1000,
            max_timed_ms=3000.0,
        )
        print(
            f"time_calls {r.method}: escaped={r.escaped} n={len(r.samples_ms)} median "
            f"{statistics.median(r.samples_ms):.4f} ms, second series median "
            f"{statistics.median(r.wall_ms):.4f} ms; {r.escape_detail}"
        )


if __name__ == "__main__":
    in_process()
    for mode in ("on", "off"):
        through_guard(mode)
