"""Where the guard's ``round.compare`` phase goes on a problem with huge outputs: the
reference worker's ``compare`` step opens each candidate output from its CUDA IPC handle and
copies it (``guard/cuda_ipc.py::read_ipc``), then judges the copy
(``guard/compare.py::check_output``). This times those parts apart, on one GPU.

    python benchmarks/exchange_cost.py [--gib 8] [--outputs 3] [--repeat 3]

An exporter subprocess holds ``--outputs`` float32 tensors of ``--gib`` GiB each and exports
them as the candidate worker does (``cuda_ipc.Exporter``); this process, in the reference
worker's place, reads each one ``--repeat`` times and judges the copy against its reference
(the same values before a little noise): with the fused Triton pass and with the torch paths
only (``compare_cost.timed``). The worker hands its cached device memory back to the driver
after each request (``held_memory.release_cached``), so each round's first copy allocates
anew: the parts are timed that way, and ``read_ipc`` as a whole on a cached block.

Printed per part: the median seconds per output and that times ``--outputs`` (L2 025's
correctness round: 3 outputs of 8 GiB; docs/PERFORMANCE.md session 41, where
``round.compare`` read 0.35 s a round with the fused pass, against the kernel's 0.013 s per
8 GiB alone). The first fused check in this process is shown apart: it includes loading (or
compiling) the Triton kernel, as in a fresh guard worker.

Memory: the exporter's outputs, plus one reference and one copy here (40 GiB with the
defaults). A benchmark: it asserts that every check passes, nothing more. CUDA only: without
a GPU it exits 2 and says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

#: The candidate's side: ``n`` float32 elements per output, output i the reference of seed i
#: plus noise far inside compare_cost's tolerance; one header per output on one line, then
#: it holds them until its stdin closes.
EXPORTER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {src!r})
    import torch
    from kernelarc.guard.cuda_ipc import Exporter
    ex, heads = Exporter(), []
    for i in range({outputs}):
        g = torch.Generator(device="cuda").manual_seed(i)
        t = torch.randn({n}, device="cuda", generator=g)
        t.add_(torch.randn({n}, device="cuda", generator=g), alpha=1e-4)
        heads.append(ex.export(t, "float32"))
        del t
    print(json.dumps(heads), flush=True)
    sys.stdin.read()
    """
)


#: The label of the first fused check (it loads or compiles the Triton kernel).
FIRST = "first in process"


def _reference(i: int, n: int) -> Any:
    import torch

    g = torch.Generator(device="cuda").manual_seed(i)
    return torch.randn(n, device="cuda", generator=g)


def _read_parts(header: dict[str, Any], n: int) -> tuple[dict[str, float], Any]:
    """``read_ipc``'s steps one by one (open, copy, close), each synchronised and timed."""
    import torch

    from kernelarc.guard.cuda_ipc import _Driver, _Raw

    drv = _Driver()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ptr = drv.open_handle(bytes.fromhex(header["ipc"]))
    t1 = time.perf_counter()
    view = torch.as_tensor(_Raw(ptr + header["offset"], header["nbytes"]), device="cuda")
    private = view.clone()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    del view
    drv.close_handle(ptr)
    t3 = time.perf_counter()
    parts = {"open handle": t1 - t0, "copy (fresh allocation)": t2 - t1, "close handle": t3 - t2}
    return parts, private.view(torch.float32).reshape(n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=8.0, help="size of one output, GiB float32")
    ap.add_argument("--outputs", type=int, default=3, help="outputs a round (L2 025: 3)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.gib <= 0 or args.outputs < 1 or args.repeat < 1:
        ap.error("--gib must be positive, --outputs and --repeat at least 1")
    import torch

    if not torch.cuda.is_available():
        print("exchange_cost.py needs a CUDA GPU (CUDA IPC); none is visible", file=sys.stderr)
        return 2
    import compare_cost

    from kernelarc.guard.cuda_ipc import read_ipc

    n = int(args.gib * (1 << 30)) // 4
    code = EXPORTER.format(src=str(HERE.parent / "src"), outputs=args.outputs, n=n)
    exp = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert exp.stdin is not None and exp.stdout is not None
    try:
        line = exp.stdout.readline()
        if not line:
            print(f"the exporter died (rc {exp.wait()})", file=sys.stderr)
            return 1
        heads = json.loads(line)
        times: dict[str, list[float]] = {}
        for i, head in enumerate(heads):
            ref = _reference(i, n)
            for r in range(args.repeat):
                # as the worker between requests (held_memory.release_cached): the cached
                # blocks go back to the driver, so the copy below allocates anew
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                torch.cuda.empty_cache()
                times.setdefault("free cached (empty_cache)", []).append(time.perf_counter() - t0)
                parts, out = _read_parts(head, n)
                for k, v in parts.items():
                    times.setdefault(k, []).append(v)
                del out  # its block stays cached: read_ipc's copy reuses it
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = read_ipc(head, torch.float32, [n], 4 * n, "cuda")
                times.setdefault("read_ipc (whole, cached block)", []).append(
                    time.perf_counter() - t0
                )
                first = i == 0 and r == 0
                key = f"check, fused ({FIRST})" if first else "check, fused"
                times.setdefault(key, []).extend(compare_cost.timed("fused", out, ref, 1))
                times.setdefault("check, torch paths", []).extend(
                    compare_cost.timed("fast", out, ref, 1)
                )
                del out
            del ref
    finally:
        exp.stdin.close()
        exp.wait(timeout=120)
    print(f"{torch.cuda.get_device_name()}: {args.outputs} outputs of {n} float32 elements, "
          f"{args.repeat} reads each")  # fmt: skip
    print(f"{'part':34s} {'s/output':>9s} {'s/round':>8s}  n")
    for k, v in times.items():
        med = statistics.median(v)
        per_round = "-" if FIRST in k else f"{med * args.outputs:.3f}"
        print(f"{k:34s} {med:9.4f} {per_round:>8s}  {len(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
