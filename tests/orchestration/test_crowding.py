"""Reading PyTorch's CUDA out-of-memory message (``orchestration/crowding.py``), on the CPU.

The message below is the allocator's wording as a CUDA GPU prints it (a candidate beside
another process's tuning). The judge's use of it, with a real guard,
is in ``test_judge_time_limit.py``.

Not covered here: the device's free memory itself (read with ``torch.cuda.mem_get_info``,
a GPU only).
"""

from __future__ import annotations

import pytest

from kernelarc.orchestration.crowding import (
    ROOM_MARGIN,
    crowded_out,
    parse_out_of_memory,
    wait_for_room,
)

GIB = 1 << 30
H100_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a "
    "total capacity of 79.18 GiB of which 4.08 GiB is free. Including non-PyTorch memory, "
    "this process has 32.96 GiB memory in use. Of the allocated memory 32.10 GiB is "
    "allocated by PyTorch, and 180.00 MiB is reserved by PyTorch but unallocated."
)


def own(tried: str, this: str, free: str = "1.00 GiB") -> str:
    return (
        f"CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
        f"79.18 GiB of which {free} is free. Including non-PyTorch memory, this process has "
        f"{this} memory in use."
    )


def test_the_figures_are_read_and_the_neighbours_are_blamed() -> None:
    oom = parse_out_of_memory("Traceback ...\n" + H100_MESSAGE)
    assert oom is not None
    assert oom.tried == 16 * GIB and oom.this_process == int(32.96 * GIB)
    assert oom.total == int(79.18 * GIB) and oom.free == int(4.08 * GIB)
    assert abs(oom.others - 42.14 * GIB) < 0.01 * GIB
    assert oom.crowded
    assert oom.need == oom.this_process + 16 * GIB + ROOM_MARGIN
    assert "42.1 GiB" in oom.describe() and "16.0 GiB more" in oom.describe()
    assert "when the candidate (holding 33.0 GiB)" in oom.describe()


def test_a_reference_that_ran_out_beside_the_candidate_is_named_as_such() -> None:
    """The reference worker ran out making its inputs while the compiled candidate's
    worker held 49 GiB."""
    log = "the reference failed: InputGenerationError: ... raised OutOfMemoryError: " + own(
        "8.00 GiB", "24.80 GiB", free="5.20 GiB"
    )
    oom = parse_out_of_memory(log)
    assert oom is not None and oom.crowded
    assert "when the reference worker (holding 24.8 GiB) asked for 8.0 GiB" in oom.describe()


@pytest.mark.parametrize(
    "message",
    [
        own("30.00 GiB", "38.00 GiB", free="40.00 GiB"),  # others: 1.2 GiB; its own failure
        own("512.00 MiB", "78.00 GiB", free="100.00 MiB"),  # it filled the device itself
        own("6.00 GiB", "60.00 GiB", free="15.00 GiB"),  # others: 4.2 GiB, the baseline
        own("200.00 GiB", "1.00 GiB"),  # more than the whole device
    ],
)
def test_a_candidate_that_would_not_fit_alone_is_not_crowded(message: str) -> None:
    oom = parse_out_of_memory(message)
    assert oom is not None and not oom.crowded, oom
    assert crowded_out([message]) is None


@pytest.mark.parametrize(
    "log",
    [
        "RuntimeError: variant fails on purpose",
        "CUDA out of memory. Tried to allocate 2.00 GiB",  # without the device's figures
        "triton.runtime.errors.OutOfResources: out of resource: shared memory",
    ],
)
def test_other_failures_are_not_read_as_crowding(log: str) -> None:
    assert parse_out_of_memory(log) is None and crowded_out([log]) is None


def test_the_first_crowded_failure_is_the_one_reported() -> None:
    mine = own("30.00 GiB", "38.00 GiB", free="40.00 GiB")
    found = crowded_out(["RuntimeError: x", mine, H100_MESSAGE])
    assert found is not None and found.tried == 16 * GIB


class Clock:
    """A clock that moves only when slept on (no test waits for real)."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_wait_ends_when_the_device_has_room() -> None:
    clock, frees = Clock(), iter([1 * GIB, 2 * GIB, 9 * GIB])
    room, waited, free = wait_for_room(
        8 * GIB, lambda: next(frees), 60, poll_s=2, sleep=clock.sleep, clock=lambda: clock.now
    )
    assert (room, waited, free) == (True, 4.0, 9 * GIB)


def test_the_wait_gives_up_at_its_budget() -> None:
    clock, polls = Clock(), []

    def free() -> int:
        polls.append(clock.now)
        return GIB

    room, waited, last = wait_for_room(
        8 * GIB, free, 7, poll_s=2, sleep=clock.sleep, clock=lambda: clock.now
    )
    assert not room and last == GIB and waited <= 7
    assert polls == [0, 2, 4, 6]
    assert wait_for_room(8 * GIB, free, 0, sleep=clock.sleep, clock=lambda: clock.now)[0] is False
