"""Whether CUDA IPC works between two processes here, and under which isolation.

    python benchmarks/ipc_probe.py [--mib 256]

An exporter process (plain, then under each ``unshare`` variant the guard may use for
candidates) allocates a tensor and exports it twice — with ``guard/cuda_ipc.py``'s driver
calls and with torch's own ``_share_cuda_`` — and this process opens both. Prints one line
per (isolation, method): ok, or the error. GPU only.

    python benchmarks/ipc_probe.py --pairs [--start 256]

Instead opens the driver export in a reader *subprocess*, itself under each variant, for
every (exporter, reader) pair: the guard runs both of its workers isolated, and under
``unshare --pid`` each is PID 1 of its own namespace.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

EXPORTER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {src!r})
    import torch
    from kernelarc.guard.cuda_ipc import Exporter
    n = {n}
    t = torch.arange(n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    out = {{}}
    ex = Exporter()
    try:
        out["driver"] = ex.export(t[{start}:], "float32")
    except Exception as e:
        out["driver_error"] = repr(e)
    try:
        s = t.untyped_storage()._share_cuda_()
        out["torch"] = [x.hex() if isinstance(x, bytes) else x for x in s]
    except Exception as e:
        out["torch_error"] = repr(e)
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    """
)

WRAPPERS = {
    "plain": (),
    "unshare --net": ("unshare", "--net"),
    "unshare --pid": ("unshare", "--pid", "--mount-proc", "--fork", "--kill-child"),
    "unshare --map-root-user --net --pid": (
        "unshare", "--map-root-user", "--net", "--pid", "--mount-proc", "--fork", "--kill-child"
    ),
}  # fmt: skip


def _open_torch(fields: list, n: int) -> None:
    import torch

    args = [bytes.fromhex(x) if i in (1, 4, 6) and isinstance(x, str) else x
            for i, x in enumerate(fields)]  # fmt: skip
    st = torch.UntypedStorage._new_shared_cuda(*args)
    t = torch.empty(0, dtype=torch.float32, device="cuda").set_(st, 0, (n,), (1,))
    assert torch.equal(t[:5].cpu(), torch.arange(5.0)), "wrong values"


def _read_stdin_header() -> None:
    """Reader role (``--read``): one header on stdin, one line of verdict on stdout."""
    import torch

    from kernelarc.guard.cuda_ipc import read_ipc

    got = json.loads(sys.stdin.readline())
    start, n = got["start"], got["n"]
    torch.zeros(1, device="cuda")
    try:
        m = n - start
        t = read_ipc(got["driver"], torch.float32, [m], 4 * m, "cuda")
        want = torch.arange(n, dtype=torch.float32, device="cuda")[start:]
        bad = (t != want).nonzero()
        if bad.numel():
            i = int(bad[0])
            print(f"{bad.numel()} wrong of {m}; first at {i}: {t[i].item()} != {want[i].item()}")
        else:
            print("ok")
    except Exception as e:
        print(repr(e))


def _pairs(n: int, start: int) -> None:
    code = EXPORTER.format(src=str(ROOT / "src"), n=n, start=start)
    for ename, ewrap in WRAPPERS.items():
        if ename == "unshare --net":
            continue  # exporters: plain and the PID-namespace levels the guard uses
        for rname, rwrap in WRAPPERS.items():
            exp = subprocess.Popen([*ewrap, sys.executable, "-c", code], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
            assert exp.stdout is not None and exp.stdin is not None
            got = json.loads(exp.stdout.readline() or "{}")
            if "driver" not in got:
                verdict = f"export failed: {got}"
            else:
                r = subprocess.run(
                    [*rwrap, sys.executable, str(Path(__file__).resolve()), "--read"],
                    input=json.dumps({**got, "n": n, "start": start}) + "\n",
                    capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                verdict = (r.stdout.strip() or r.stderr.strip()[-300:]).splitlines()[-1:]
                verdict = verdict[0] if verdict else f"reader rc {r.returncode}"
            exp.stdin.write("\n")
            exp.stdin.flush()
            exp.wait(timeout=60)
            print(f"exporter {ename} | reader {rname} | start {start} | {verdict}", flush=True)


def main() -> None:
    if "--read" in sys.argv:
        _read_stdin_header()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--start", type=int, default=0, help="export t[start:] (an offset)")
    ap.add_argument("--only", default=None, help="one isolation variant by name")
    ap.add_argument("--pairs", action="store_true", help="reader subprocesses, every pair")
    args = ap.parse_args()
    import torch

    from kernelarc.guard.cuda_ipc import read_ipc

    n = args.mib * (1 << 20) // 4
    if args.pairs:
        _pairs(n, args.start)
        return
    torch.zeros(1, device="cuda")
    rows = []
    for name, wrap in WRAPPERS.items():
        if args.only and name != args.only:
            continue
        code = EXPORTER.format(src=str(ROOT / "src"), n=n, start=args.start)
        try:
            proc = subprocess.Popen(
                [*wrap, sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as e:
            rows.append((name, "spawn", repr(e)))
            continue
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            rows.append((name, "spawn", err.strip()[-300:]))
            proc.wait()
            continue
        got = json.loads(line)
        for method in ("driver", "torch"):
            if f"{method}_error" in got:
                rows.append((name, method, "export: " + got[f"{method}_error"]))
                continue
            try:
                if method == "driver":
                    m = n - args.start
                    t = read_ipc(got["driver"], torch.float32, [m], 4 * m, "cuda")
                    want = torch.arange(args.start, n, dtype=torch.float32, device="cuda")
                    bad = (t != want).nonzero()
                    if bad.numel():
                        i = int(bad[0])
                        raise AssertionError(
                            f"{bad.numel()} wrong of {m}; first at {i}: {t[i].item()} "
                            f"!= {want[i].item()}; offset {got['driver']['offset']}"
                        )
                else:
                    _open_torch(got["torch"], n)
                rows.append((name, method, "ok"))
            except Exception as e:
                rows.append((name, method, f"{e!r} {traceback.format_exc(limit=2)[-200:]}"))
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
    for r in rows:
        print(" | ".join(r))


if __name__ == "__main__":
    main()
