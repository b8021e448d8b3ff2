"""Both guard workers time on input pools placed by one rule (``timing.timing_pool`` and
``timing.pool_shift``): every tensor 64 elements into an allocation of its own, moved to the
next offset each time the calls wrap around the pool.

A reference timed at offset 0 (never moved) while candidates are timed 64 elements in
would be favoured: on the H200 such a pool read FIB 002's compiled kernel 0.8-4.1% faster
than a candidate's pool. CPU only: the pool
builder, and the reference role's timing loop in a real subprocess, whose reference records
the storage offset of every input it is timed on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch

from kernelarc.examples import example_dir
from kernelarc.guard.timing import move_pool, pool_shift, timing_pool


def test_pool_shift_starts_at_64_and_moves_on_every_wrap() -> None:
    assert pool_shift(0) == 64
    offsets = [pool_shift(c) for c in range(32)]
    assert len(set(offsets)) == 32  # no offset repeats within 32 wraps
    assert pool_shift(32) == pool_shift(0)


def test_timing_pool_places_every_tensor_of_every_set_at_the_first_shift() -> None:
    made: list[int] = []

    def make(seed: int) -> list[object]:
        made.append(seed)
        return [torch.full((3, 4), float(seed)), 7, torch.arange(5)]

    pool = timing_pool(make, [10, 11, 12, 13, 14], 3, torch.device("cpu"), cap=0)
    assert made == [10, 11, 12]  # no more sets than calls
    for seed, entry in zip(made, pool, strict=True):
        assert torch.equal(entry[0], torch.full((3, 4), float(seed))) and entry[1] == 7
        assert [t.storage_offset() for t in (entry[0], entry[2])] == [64, 64]
    ptrs = [entry[0].data_ptr() for entry in pool]
    move_pool(pool, 3)
    for seed, entry, ptr in zip(made, pool, ptrs, strict=True):
        assert torch.equal(entry[0], torch.full((3, 4), float(seed))) and entry[1] == 7
        assert [t.storage_offset() for t in (entry[0], entry[2])] == [pool_shift(3)] * 2
        assert entry[0].data_ptr() != ptr
    capped = timing_pool(make, [1, 2, 3], 50, torch.device("cpu"), cap=2)
    assert len(capped) == 2


RECORDER = '''
import json, sys
from kernelarc.examples import example_dir
from kernelarc.guard.messages import ReferenceSetup, TimeRequest
from kernelarc.guard.worker import ReferenceRole
from kernelarc.problem.loader import load_problem

problem = load_problem(example_dir("rmsnorm_h512"))
source = """
import torch

OFFSETS = []


@torch.no_grad()
def run(hidden_states, weight):
    OFFSETS.append([hidden_states.storage_offset(), weight.storage_offset()])
    x = hidden_states.to(torch.float32)
    return (x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + 1e-6) * weight).to(
        hidden_states.dtype
    )
"""
definition = problem.definition.model_copy(update={"reference": source})
role = ReferenceRole(ReferenceSetup(device="cpu", definition=definition))
reply = role.time(
    TimeRequest(workload=problem.workloads[0], seeds=[1, 2, 3, 4], warmup=2, iterations=8)
)
assert reply.ok, reply
print(json.dumps(role.module.OFFSETS))
'''


def test_the_reference_worker_times_on_pools_placed_and_moved_as_the_candidates_are() -> None:
    assert example_dir("rmsnorm_h512").is_dir()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RECORDER)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    offsets = json.loads(proc.stdout.strip().splitlines()[-1])
    # Four sets for ten calls: calls 0-3 at the first placement, 4-7 after one wrap, ...
    assert offsets == [[pool_shift(i // 4)] * 2 for i in range(10)]
