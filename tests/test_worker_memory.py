"""Workers hand back cached device memory between requests (``guard.worker.release_cached``):
the reference and candidate workers share one GPU, and a problem whose tensors fill most of
it fails in one worker while the other's allocator still caches its last request's memory.
They also hand it back right after making a request's inputs, so that no small tensor keeps
a freed temporary of the generation reserved. GPU only (on the CPU there is no allocator
cache to hand back)."""

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


def _generated_weights(dev: torch.device) -> torch.Tensor:
    """Like L2 025's generator (``randn(...) * 0.02``): the result, and a freed temporary
    as large left in the allocator's cache."""
    tmp = torch.randn((3 * CACHED_BYTES_KEPT) // 8, device=dev)  # 1.5x the allowance
    out = tmp * 0.02
    del tmp
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA torch and a GPU")
@pytest.mark.parametrize("hand_back", [False, True])
def test_a_small_tensor_holds_a_freed_temporary_unless_it_was_handed_back(
    hand_back: bool,
) -> None:
    """The pattern inferred from L2 025 on an H100 (session 34: its candidate worker held
    8.66 GiB more than its outputs): a small tensor made after the inputs is carved out of
    the generator's freed temporary and keeps all of it reserved. Handed back first
    (what both workers now do after making the inputs), the small tensor gets memory of
    its own. The first case checks the inference itself on the device."""
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(dev)
    weights = _generated_weights(dev)
    if hand_back:
        release_cached(dev)
    small = torch.zeros(32 << 20, dtype=torch.uint8, device=dev)  # as grad_hidden_states
    del weights
    torch.cuda.empty_cache()
    held = torch.cuda.memory_reserved(dev) - base
    del small
    torch.cuda.empty_cache()
    temp_bytes = (3 * CACHED_BYTES_KEPT) // 2
    if hand_back:
        assert held < 256 << 20, held
    else:
        assert held >= temp_bytes, held
