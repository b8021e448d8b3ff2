"""Telling a candidate's own out-of-memory failure from one caused by its neighbours.

A candidate runs on a GPU it shares with the guard's reference worker, the warm spare
worker and whatever the agents run beside the search (the gemm-tables agent's TunableOp
tuning subprocess). When one of those holds a large share of the device, a candidate that
fits the device on its own can fail with "CUDA out of memory" (a 16 GiB allocation failing
while other processes hold tens of GiB). Caching that verdict would judge the neighbours,
not the candidate.

PyTorch's caching allocator says in its message what the device held:
``Tried to allocate X. GPU 0 has a total capacity of T of which F is free. ... this process
has P memory in use``. What other processes held is ``T - F - P``. The failure is *crowded*
when the allocation that failed would have fit in what the others held beyond
:data:`NEIGHBOUR_BASELINE` (what the guard's own workers and this process hold on any
problem: CUDA contexts, cached blocks). The judge then waits, for a bounded time, until the
device's free memory (read by the trusted parent, not the candidate) covers what the
candidate had plus what it asked for, and judges it once more in a fresh worker.

Not covered: an out-of-memory failure worded otherwise (a Triton or CUDA-driver error
without the allocator's figures) is the candidate's; a neighbour that never lets go within
the wait leaves the verdict standing (annotated). The candidate's own worker writes the
message, so a candidate can fake one: the most it gains is one more judgement.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from kernelarc.guard.verdict import REFERENCE_FAILED

_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"([0-9.]+) (bytes|KiB|MiB|GiB|TiB)"
_TRIED = re.compile(r"CUDA out of memory\. Tried to allocate " + _SIZE)
_CAPACITY = re.compile(r"total capacity of " + _SIZE + r" of which " + _SIZE + r" is free")
_THIS = re.compile(r"this process has " + _SIZE + r" memory in use")

#: What other processes may hold on the device without crowding a candidate out.
NEIGHBOUR_BASELINE = 4 << 30
#: Room kept above what the candidate had plus what it asked for before judging it again.
ROOM_MARGIN = 1 << 30
#: The longest the judge waits for the device to have room, and its share of the time left.
CROWD_WAIT_S = 90.0
CROWD_WAIT_SHARE = 0.25
POLL_S = 2.0


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNITS[unit])


@dataclass(frozen=True)
class OutOfMemory:
    """The figures of one PyTorch CUDA out-of-memory message, in bytes."""

    tried: int
    total: int
    free: int
    this_process: int
    who: str = "the candidate"
    """The process that failed: the candidate, or the reference worker (a log of
    INVALID_REFERENCE: the reference ran out beside the candidate's worker)."""

    @property
    def others(self) -> int:
        """What other processes (and the driver) held on the device."""
        return max(0, self.total - self.free - self.this_process)

    @property
    def crowded(self) -> bool:
        """The failed allocation would have fit in what the others held beyond
        :data:`NEIGHBOUR_BASELINE` (so :attr:`need` fits the device)."""
        return self.others - NEIGHBOUR_BASELINE >= self.tried

    @property
    def need(self) -> int:
        """Free device memory to wait for before judging the candidate again."""
        return self.this_process + self.tried + ROOM_MARGIN

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"other processes held {self.others / gib:.1f} GiB of the device's "
            f"{self.total / gib:.1f} GiB when {self.who} (holding "
            f"{self.this_process / gib:.1f} GiB) asked for {self.tried / gib:.1f} GiB more"
        )


def parse_out_of_memory(log: str) -> OutOfMemory | None:
    """The figures of the first CUDA out-of-memory message in ``log``, or None when there
    is none or it lacks any of them."""
    tried, cap, this = _TRIED.search(log), _CAPACITY.search(log), _THIS.search(log)
    if tried is None or cap is None or this is None:
        return None
    return OutOfMemory(
        tried=_bytes(*tried.groups()),
        total=_bytes(cap.group(1), cap.group(2)),
        free=_bytes(cap.group(3), cap.group(4)),
        this_process=_bytes(*this.groups()),
        who="the reference worker" if REFERENCE_FAILED in log else "the candidate",
    )


def crowded_out(logs: list[str]) -> OutOfMemory | None:
    """The crowded out-of-memory failure among these failure logs (the first), if any."""
    for log in logs:
        oom = parse_out_of_memory(log)
        if oom is not None and oom.crowded:
            return oom
    return None


def wait_for_room(
    need: int,
    free_bytes: Callable[[], int],
    budget_s: float,
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, float, int]:
    """Poll ``free_bytes`` until it reports ``need`` or ``budget_s`` runs out. Returns
    (room found, seconds waited, the last free figure)."""
    t0 = clock()
    while True:
        free = free_bytes()
        waited = clock() - t0
        if free >= need:
            return True, waited, free
        if waited + poll_s > budget_s:
            return False, waited, free
        sleep(poll_s)


def device_free_bytes(device: str) -> Callable[[], int]:
    """The device's free memory, as the driver reports it to this (trusted) process. The
    first call creates a CUDA context here (a few hundred MB of the device, kept)."""

    def free() -> int:
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])

    return free
