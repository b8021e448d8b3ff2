"""Workers hand back cached device memory between requests (``guard.worker.release_cached``):
the reference and candidate workers share one GPU, and a problem whose tensors fill most of
it fails in one worker while the other's allocator still caches its last request's memory.
GPU only (on the CPU there is no allocator cache to hand back)."""

from __future__ import annotations

import pytest
import torch

from kernelarc.guard.worker import CACHED_BYTES_KEPT, release_cached


def test_release_cached_is_a_no_op_off_cuda() -> None:
    release_cached(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA torch and a GPU")
def test_release_cached_returns_memory_above_the_allowance() -> None:
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    small = torch.empty(CACHED_BYTES_KEPT // 4, dtype=torch.uint8, device=dev)
    del small
    kept = torch.cuda.memory_reserved(dev)
    release_cached(dev)
    assert torch.cuda.memory_reserved(dev) == kept, "below the allowance the cache stays"
    big = torch.empty(2 * CACHED_BYTES_KEPT, dtype=torch.uint8, device=dev)
    del big
    assert torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev) > CACHED_BYTES_KEPT
    release_cached(dev)
    unused = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    assert unused <= CACHED_BYTES_KEPT
