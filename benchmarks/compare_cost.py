"""What the guard's output comparison (``guard.compare.check_output``) costs on one device:
the fused Triton pass (CUDA only), the torch fast path and the masked path they fall back
to, on float32 outputs of a given size (L2 025: 6.4 G elements a round,
docs/PERFORMANCE.md session 36).

    python benchmarks/compare_cost.py [--device cuda] [--gib 8] [--repeat 3]

Prints, per path, the median seconds of ``--repeat`` comparisons of one ``--gib`` GiB
float32 output against its reference (a pair differing by a little noise, every element
within the tolerance), and the effective rate in elements per ns. A benchmark, not a test:
the equality of the two paths' results is tested in ``tests/test_compare.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import kernelarc.guard.compare as cmp  # noqa: E402
from kernelarc.problem.schema import Tolerance  # noqa: E402

TOL = Tolerance(max_atol=1e-2, max_rtol=1e-2, required_matched_ratio=0.99)


def timed(path: str, out: torch.Tensor, ref: torch.Tensor, repeat: int) -> list[float]:
    fast, fused_min = cmp._chunk_float, cmp.FUSED_MIN_ELEMS
    if path == "masked":
        cmp._chunk_float = cmp._chunk_float_masked  # the old path for every chunk
    if path != "fused":
        cmp.FUSED_MIN_ELEMS = 1 << 62  # no chunk is large enough: the torch paths
    try:
        runs = []
        for _ in range(repeat):
            if out.is_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = cmp.check_output("y", out, ref, TOL, expected_shape=tuple(ref.shape),
                                 expected_dtype=torch.float32)  # fmt: skip
            if out.is_cuda:
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - t0)
            assert r.ok, r.message
        return runs
    finally:
        cmp._chunk_float, cmp.FUSED_MIN_ELEMS = fast, fused_min


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gib", type=float, default=8.0, help="size of one output, GiB float32")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = int(args.gib * (1 << 30)) // 4
    ref = torch.randn(n, device=args.device)
    out = ref + 1e-4 * torch.randn(n, device=args.device)
    rows = []
    paths = ("masked", "fast", "fused") if args.device.startswith("cuda") else ("masked", "fast")
    timed("fused" if "fused" in paths else "fast", out, ref, 1)  # the kernel's first compile
    for path in paths * 2:  # interleaved: drift shows
        med = statistics.median(timed(path, out, ref, args.repeat))
        rows.append((path, med))
        print(f"{path:7s} {med:8.3f} s  {n / med / 1e9:6.2f} elements/ns", flush=True)
    med = {p: statistics.median(s for q, s in rows if q == p) for p in paths}
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    line = ", ".join(f"{p} {s:.3f} s ({med['masked'] / s:.2f}x)" for p, s in med.items())
    print(f"{name}: {n} elements; {line} (x: against masked)")


if __name__ == "__main__":
    main()
