"""Device memory a guard worker holds without needing it, and handing it back.

The reference and candidate workers share one GPU and take turns: on a problem whose
tensors fill most of it (L2 025: 24 GiB of inputs, 24 GiB of outputs), whatever one worker
keeps beyond what it uses leaves the other too little. Two things keep such memory:

- **the caching allocator**: freed blocks stay reserved by the process.
  :func:`release_cached` hands them back above :data:`CACHED_BYTES_KEPT`. Workers call it
  between requests and right after making a request's inputs; otherwise a small tensor can
  be carved out of a freed generator temporary and keep all of it reserved (checked on an
  H100: ``tests/test_worker_memory.py``).
- **garbage cycles**: a tensor referenced only from a reference cycle stays allocated until
  Python's cyclic collector runs. ``torch.compile``'s first call of a function, the call
  that compiles it, leaves that call's inputs and outputs in such cycles. This was seen with
  L2 025's reference on the CPU (torch 2.13): all 7 inputs and 5 outputs were still alive
  after ``del`` until ``gc.collect()``; later calls left none. On an 80 GB H100 this fits
  two failures of session 35:
  - the compiled candidate held 49 GiB, its inputs and outputs, while the reference worker
    made its inputs;
  - the compiled baseline's reference worker had 72.8 GiB in use during timing: the pool,
    plus two calls' outputs.

  :func:`collect_cycles` runs the collector when a worker has more than
  :data:`CYCLES_CHECKED_ABOVE` allocated. It runs after every request, and in timing
  loops after the first call, the one that may compile. A collection costs 0.1-0.25 s,
  so a problem of small tensors skips it.

Not covered: memory that live references hold (a candidate keeping its inputs on purpose
is its own footprint, judged as such), memory of other processes, and host memory (on the
CPU both functions do nothing).
"""

from __future__ import annotations

import gc
from typing import Any

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


def collect_cycles(device: Any) -> bool:
    """Run Python's cyclic collector when this process has more than
    :data:`CYCLES_CHECKED_ABOVE` allocated on ``device``. Returns whether it ran."""
    if not _cuda(device):
        return False
    import torch

    if torch.cuda.memory_allocated(device) <= CYCLES_CHECKED_ABOVE:
        return False
    gc.collect()
    return True
