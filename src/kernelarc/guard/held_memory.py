"""Device memory a guard worker holds without needing it, and handing it back.

The reference and candidate workers share one GPU and take turns: on a problem whose
tensors fill most of it (inputs and outputs of tens of GB), whatever one worker
keeps beyond what it uses leaves the other too little. Two things keep such memory:

- **the caching allocator**: freed blocks stay reserved by the process.
  :func:`release_cached` hands them back above :data:`CACHED_BYTES_KEPT`. Workers call it
  between requests and right after making a request's inputs; otherwise a small tensor can
  be carved out of a freed generator temporary and keep all of it reserved (checked on an
  H100: ``tests/guard/test_worker_memory.py``).
- **garbage cycles**: a tensor referenced only from a reference cycle stays allocated until
  Python's cyclic collector runs. ``torch.compile``'s first call of a function, the call
  that compiles it, can leave that call's inputs and outputs in such cycles (a function
  whose loop has graph breaks: all its inputs and outputs stay alive after ``del`` until
  ``gc.collect()``; docs/GUARD.md). Such a frame is traced and then skipped: it compiles
  no graph, so the trigger is the count of frames Dynamo traced, not of graphs. On a GPU
  such cycles can hold a compiled candidate's inputs and outputs while the reference
  worker makes its own.

  :class:`CycleCollector` runs the collector when Dynamo traced a frame during a request
  or a timing loop's first call (:func:`traced_frames`) and the worker has more than
  :data:`CYCLES_CHECKED_ABOVE` allocated,
  or whenever it has over a quarter of the device allocated. Workers check after every
  request, and timing loops after their first call. A collection costs 0.1-0.25 s, so
  it is not run after every request of every problem: the reference worker alone keeps up
  to 4 GiB of outputs cached.

Not covered: memory that live references hold (a candidate keeping its inputs on purpose
is its own footprint, judged as such), memory of other processes, and host memory (on the
CPU neither the collector nor :func:`release_cached` does anything).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from kernelarc.guard.footprint import device_bytes

#: Device memory a worker's allocator may keep cached between requests.
CACHED_BYTES_KEPT = 1 << 30
#: Allocated device memory above which a worker looks for garbage cycles that hold tensors.
CYCLES_CHECKED_ABOVE = 1 << 30


def _cuda(device: Any) -> bool:
    return getattr(device, "type", None) == "cuda"


def release_cached(device: Any) -> None:
    """Return cached, unused device memory to the driver when it exceeds the allowance."""
    if not _cuda(device):
        return
    import torch

    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if unused > CACHED_BYTES_KEPT:
        torch.cuda.empty_cache()


def _dynamo_counter(group: str, name: str) -> int:
    """One of Dynamo's counters: 0 when Dynamo was never loaded, -1 when it cannot be read
    (a torch without it: every check then counts as after a compile). The candidate runs
    in this process and can change it; at worst it skips collections of its own garbage."""
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters

        return int(counters[group][name])
    except (ImportError, KeyError, TypeError, ValueError):
        return -1


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (:func:`_dynamo_counter`
    says what 0 and -1 mean)."""
    return _dynamo_counter("stats", "unique_graphs")


def traced_frames() -> int:
    """Frames Dynamo has traced in this process so far, compiled or skipped (a frame is
    traced on a cache miss only; :func:`_dynamo_counter` says what 0 and -1 mean)."""
    return _dynamo_counter("frames", "total")


class CycleCollector:
    """Runs Python's cyclic collector when garbage cycles may hold device memory (the
    module docstring says when). One per worker process, one per timing loop."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.cuda = _cuda(device)
        self.frames = traced_frames()
        self.total = 0
        if self.cuda:
            self.total = device_bytes(str(device)) or 0

    def __call__(self) -> bool:
        """Collect if there is reason to since the last call; returns whether it did."""
        if not self.cuda:
            return False
        import torch

        frames = traced_frames()
        traced, self.frames = frames != self.frames or frames < 0, frames
        allocated = torch.cuda.memory_allocated(self.device)
        if allocated > self.total // 4 or (traced and allocated > CYCLES_CHECKED_ABOVE):
            gc.collect()
            return True
        return False
