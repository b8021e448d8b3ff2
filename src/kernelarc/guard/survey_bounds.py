"""Roofline bounds for ``check-problems``, computed in a helper process with a time limit.

Counting flops runs the reference (on meta tensors, or on small real CPU tensors: see
``roofline/flops.py``), so a reference that hangs or crashes must not take the sweep with
it. :class:`BoundsHelper` keeps one ``python -m kernelarc.guard.survey_bounds`` process for
the whole sweep (torch imported once), sends it one JSON line per problem (problem path,
workload uuids, device) and reads one JSON line back (``{uuid: ms}`` and warnings) within
the time limit; on expiry or a crash the process group is killed and the next request
starts a fresh one. The helper's stdout is reserved for replies (the reference's prints go
to stderr, which is discarded).

Not covered: isolation (the helper runs the trusted reference only, like ``kernelarc sol``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kernelarc.problem.loader import load_problem
from kernelarc.roofline.bounds import workload_bounds


class BoundsHelper:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env
        self.proc: subprocess.Popen[str] | None = None

    def _ensure(self) -> subprocess.Popen[str]:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernelarc.guard.survey_bounds"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        return self.proc

    def bounds(
        self, root: Path, uuids: list[str], device: str, timeout: float
    ) -> tuple[dict[str, float], list[str]]:
        """``{uuid: T_sol ms}`` and warnings; never raises for a reference's fault."""
        proc = self._ensure()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"root": str(root), "uuids": uuids, "device": device}))
            proc.stdin.write("\n")
            proc.stdin.flush()
        except OSError as e:
            self.close()
            return {}, [f"bounds not computed: the helper process died ({e})"]
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
            if not ready:
                self.close()
                return {}, [f"bounds not computed: counting took more than {timeout:.0f} s"]
            line = proc.stdout.readline()
            if not line:
                code = proc.wait(timeout=10)
                self.close()
                return {}, [f"bounds not computed: the helper process exited ({code})"]
            reply = json.loads(line)
            return {k: float(v) for k, v in reply["bounds"].items()}, list(reply["warnings"])

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()
        self.proc = None


def _serve() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a reference prints goes to stderr, never into the replies
    for line in sys.stdin:
        req: dict[str, Any] = json.loads(line)
        try:
            problem = load_problem(Path(req["root"]))
            chosen = [w for w in problem.workloads if w.uuid in set(req["uuids"])]
            got, warnings = workload_bounds(problem.definition, chosen, str(req["device"]))
        except Exception as e:  # reported in the survey's notes
            got, warnings = {}, [f"bounds not computed: {type(e).__name__}: {e}"]
        replies.write(json.dumps({"bounds": got, "warnings": warnings}) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
