"""Writes to a candidate's inputs found without copying large ones (``guard/call_checks.py``):
every kind of change the old byte-for-byte comparison caught, on copied and fingerprinted
tensors alike, over several chunks, on word and byte views; none found where nothing
changed. The same on CUDA when there is one."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kernelarc.guard import call_checks
from kernelarc.guard.call_checks import Untouched, fingerprint

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_checks, "CHUNK_WORDS", 64)  # several chunks even for small tensors


def _inputs(device: str) -> list[object]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(1000, generator=g).to(device),
        torch.randint(0, 255, (1001,), generator=g, dtype=torch.uint8).to(device),  # bytes
        torch.randn(37, 9, generator=g).to(device, torch.bfloat16),
        torch.randn(300, generator=g)[1:].to(device),  # a view at offset 4: still words
        3.5,  # not a tensor
        torch.zeros(0, device=device),
    ]


def _changes() -> dict[str, object]:
    def flip_two_signs(xs: list[torch.Tensor]) -> None:  # cancelled a 64-bit word sum
        xs[0][1].neg_()
        xs[0][3].neg_()

    return {
        "one element": lambda xs: xs[0].__setitem__(500, xs[0][500] + 1),
        "last byte": lambda xs: xs[1].__setitem__(1000, (int(xs[1][1000]) + 1) % 256),
        "two signs": flip_two_signs,
        "swapped": lambda xs: xs[0].__setitem__(slice(0, 2), xs[0][[1, 0]].clone()),
        "bf16 row": lambda xs: xs[2][5].zero_(),
        "offset view": lambda xs: xs[3][-1].add_(1),
        "resized": lambda xs: xs[0].resize_(999),
        "storage swapped": lambda xs: setattr(xs[0], "data", xs[0] * 1),  # same values
    }


WRITTEN = {"one element": 0, "last byte": 1, "two signs": 0, "swapped": 0, "bf16 row": 2,
           "offset view": 3, "resized": 0}  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("copy_bytes", [1 << 30, 0], ids=["copied", "fingerprinted"])
@pytest.mark.parametrize("change", list(_changes()))
def test_each_change_is_found_and_nothing_else(device: str, copy_bytes: int, change: str) -> None:
    xs = _inputs(device)
    rec = Untouched(xs, copy_bytes)
    assert rec.fingerprinted == (5 if copy_bytes == 0 else 0)
    assert rec.written(xs) == [False] * 6  # nothing changed yet
    _changes()[change](xs)
    want = [False] * 6
    if change in WRITTEN:
        want[WRITTEN[change]] = True
    assert rec.written(xs) == want  # new storage, same values: not a write


@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, 1000),  # 32-bit words
    lambda: torch.arange(-500, 501, dtype=torch.int32),  # negative words: sign-extended
    lambda: torch.arange(7, dtype=torch.uint8),  # a size that is no whole number of words
])  # fmt: skip
def test_the_fingerprint_is_the_odd_weighted_sum_of_the_words(make: Any) -> None:
    """The definition written out (32-bit words, or bytes, widened to int64; odd weights
    from the key's generator; sum modulo 2**64), against which faster forms are checked."""
    t = make()
    raw = t.reshape(-1).view(torch.uint8)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw
    gen = torch.Generator().manual_seed(99)
    w = torch.randint(-(1 << 62), 1 << 62, words.shape, generator=gen, dtype=torch.int64)
    want = int((w.bitwise_or(1) * words.to(torch.int64)).sum()) & ((1 << 64) - 1)
    assert fingerprint(t, 99) == want


def test_fingerprints_depend_on_key_and_content_alone() -> None:
    a = torch.arange(4096, dtype=torch.float32)
    assert fingerprint(a, 1) == fingerprint(a.clone(), 1)
    assert fingerprint(a, 1) != fingerprint(a, 2)
    b = a.clone()
    b[4095] = -b[4095]
    assert fingerprint(a, 7) != fingerprint(b, 7)
    assert 0 <= fingerprint(a, 7) < 1 << 64
