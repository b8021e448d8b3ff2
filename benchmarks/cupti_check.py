"""CUPTI span vs CUDA events on the same calls, three ways, on a GPU machine.

    python benchmarks/cupti_check.py

For a few calls (one bf16 matmul, an eager multi-kernel RMSNorm at a small and a large
batch, a two-kernel GELU) prints the median over 30 calls (5 warm-ups) of: CUDA events;
a CUPTI span enabled and disabled around every call (how the guard timed until
2026-12-01); a CUPTI span flushed after every call inside one session; the guard's
``time_calls`` with CUPTI (marker-bracketed calls, one flush for the loop), with its host
seconds per call. Then the stream-escape check on a call that leaves ~1 ms of work on a
side stream, under CUPTI and CUDA events. L2 flushed before every call.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from kernelarc.guard.cupti import ActivitySpan
from kernelarc.guard.timing import Flusher, time_calls


def rmsnorm_eager(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(var + 1e-6)).to(x.dtype) * w


def measure(fn: Callable[[], object], mode: str, n: int = 30, warm: int = 5) -> float:
    flush = Flusher(torch.device("cuda"))
    span = ActivitySpan()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out: list[float] = []

    def loop() -> None:
        for i in range(warm + n):
            flush()
            torch.cuda.synchronize()
            if mode == "events":
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                ms = s.elapsed_time(e)
            else:
                with span:
                    fn()
                    torch.cuda.synchronize()
                ms = span.span_ms
            if i >= warm:
                out.append(ms)

    if mode == "cupti-session":
        with span.session():
            loop()
    else:
        loop()
    return statistics.median(out)


def guard_loop(fn: Callable[[], object], cupti: bool, n: int = 30, warm: int = 5) -> tuple:
    t0 = time.perf_counter()
    res = time_calls(
        lambda i: fn(),
        lambda i: None,
        warmup=warm,
        iterations=n,
        device=torch.device("cuda"),
        use_cupti=cupti,
    )
    per_call = (time.perf_counter() - t0) / (n + warm)
    return statistics.median(res.samples_ms), per_call, res


def main() -> None:
    dev = "cuda"
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    xs = torch.randn(79, 4096, device=dev, dtype=torch.bfloat16)
    xl = torch.randn(14509, 4096, device=dev, dtype=torch.bfloat16)
    g = torch.randn(1 << 20, device=dev)
    cases: dict[str, Callable[[], torch.Tensor]] = {
        "matmul bf16 4096^3": lambda: a @ b,
        "eager rmsnorm batch 79": lambda: rmsnorm_eager(xs, w),
        "eager rmsnorm batch 14509": lambda: rmsnorm_eager(xl, w),
        "gelu tanh + mul (2 kernels, 4 MB)": lambda: (
            torch.nn.functional.gelu(g, approximate="tanh") * 2.0
        ),
    }
    rows = []
    for name, fn in cases.items():
        ev, per, ses = (measure(fn, m) for m in ("events", "cupti-per-call", "cupti-session"))
        log_ms, host_s, _ = guard_loop(fn, True)
        rows.append((name, ev, per, ses, log_ms, host_s))
    side = torch.cuda.Stream()

    def escape() -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)
            g.mul_(1.0)

    esc = [guard_loop(escape, c, n=10, warm=2)[2] for c in (True, False)]
    print(
        f"{'call':36s} {'events':>8s} {'cupti/call':>10s} {'cupti/sess':>10s} "
        f"{'guard cupti':>11s} {'host ms/call':>12s}   (µs)"
    )
    for name, ev, per, ses, log_ms, host_s in rows:
        print(
            f"{name:36s} {ev * 1e3:8.1f} {per * 1e3:10.1f} {ses * 1e3:10.1f} "
            f"{log_ms * 1e3:11.1f} {host_s * 1e3:12.2f}"
        )
    for r in esc:
        print(
            f"side-stream escape, {r.method}: escaped={r.escaped} median "
            f"{statistics.median(r.samples_ms):.3f} ms, caller/wall median "
            f"{statistics.median(r.wall_ms):.3f} ms {r.escape_detail}"
        )


if __name__ == "__main__":
    main()
