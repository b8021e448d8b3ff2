"""Checks on one call of a candidate: which inputs it wrote, and outputs that are not plain
tensors on the device or that share memory with an input.

Writes: a tensor input smaller than ``GuardConfig.copy_bytes`` is copied and compared bit
for bit. A larger contiguous one is fingerprinted instead: its bytes, read as 32-bit words
(single bytes when its size or alignment does not allow words), are summed with odd random
64-bit weights modulo 2**64, chunk by chunk on its own device: an untouched copy of inputs
of tens of GB would not fit beside them and the outputs (docs/GUARD.md); the fingerprint
needs two chunk-sized temporaries.

Covered, for writes: any change of a single word is always found (an odd weight times a nonzero
difference below 2**32 is nonzero modulo 2**64); changes of several words are missed only
when their weighted sum cancels, for weights drawn at random once the inputs exist a chance
of at most 2**-32 (a difference has at most 31 factors of two, so it fixes a weight's low
32 or more bits). Changes of shape or dtype are found either way. Not covered: a candidate that
reads the weights out of this process's memory and makes its writes cancel on purpose (it
runs in this process; the sentinel and the other checks stand against code that pries).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from kernelarc.guard.sentinel import Violation
from kernelarc.problem.schema import Definition

#: Non-tensor return values that are plain bugs (RUNTIME_ERROR); any other object in place
#: of an output tensor is treated as posing as one (REWARD_HACK[output-type]).
_HONEST_MISTAKES = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict)

CHUNK_WORDS = 1 << 24
"""Words fingerprinted per step (64 MiB of a tensor; two temporaries of as many 64-bit
integers)."""


class Untouched:
    """The inputs' state before a call; :meth:`written` names those changed since."""

    def __init__(self, inputs: Sequence[Any], copy_bytes: int) -> None:
        import torch

        self._key = secrets.randbits(62)
        self._before: list[tuple[Any, ...] | None] = []
        for t in inputs:
            if not isinstance(t, torch.Tensor):
                self._before.append(None)
            elif _nbytes(t) >= copy_bytes and t.is_contiguous():
                self._before.append(("sum", t.shape, t.dtype, fingerprint(t, self._key)))
            else:
                self._before.append(("copy", t.clone()))

    def written(self, inputs: Sequence[Any]) -> list[bool]:
        """Per input (in the order given at construction), whether the call changed it."""
        import torch

        out = []
        for t, before in zip(inputs, self._before, strict=True):
            if before is None or not isinstance(t, torch.Tensor):
                out.append(False)
            elif before[0] == "copy":
                out.append(not _same_bits(t, before[1]))
            else:
                _, shape, dtype, digest = before
                out.append(
                    t.shape != shape
                    or t.dtype != dtype
                    or not t.is_contiguous()
                    or fingerprint(t, self._key) != digest
                )
        return out

    @property
    def fingerprinted(self) -> int:
        """How many inputs are fingerprinted rather than copied."""
        return sum(1 for b in self._before if b is not None and b[0] == "sum")


def fingerprint(t: Any, key: int) -> int:
    """A contiguous tensor's bytes summed with odd weights drawn from ``key`` (module
    docstring), as a Python int in [0, 2**64)."""
    import torch

    words = _words(t)
    gen = torch.Generator(device=t.device)
    gen.manual_seed(key)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), CHUNK_WORDS):
        chunk = words[start : start + CHUNK_WORDS]  # widened to int64 inside the multiply
        w = torch.randint(
            -(1 << 62), 1 << 62, chunk.shape, generator=gen, dtype=torch.int64, device=t.device
        )
        w.bitwise_or_(1)
        w.mul_(chunk)  # wraps modulo 2**64, as does the sum
        total += w.sum()
        del w, chunk
    return int(total.item()) & ((1 << 64) - 1)


def _words(t: Any) -> Any:
    """The tensor's bytes as 32-bit words, or as single bytes where its size or address
    does not allow a word view (a view either way: no copy)."""
    import torch

    raw = t.reshape(-1).view(torch.uint8)
    if raw.numel() % 4 == 0:
        try:
            return raw.view(torch.int32)
        except RuntimeError:  # a storage offset not a multiple of 4 bytes
            pass
    return raw


def output_violations(
    definition: Definition,
    outs: Sequence[Any],
    inputs: Sequence[Any],
    device: Any,
    dps: bool,
    aliases: dict[str, str],
) -> list[Violation]:
    """Outputs that are not plain tensors on ``device``. An output sharing memory with an
    input goes to ``aliases`` (output name -> input name): allowed only where the reference
    writes that input itself (the parent decides, ``session.py``); destination-passing
    outputs are the guard's own buffers."""
    import torch

    found = []
    ranges = [
        (name, _storage_range(t))
        for name, t in zip(definition.inputs, inputs, strict=False)
        if isinstance(t, torch.Tensor)
    ]
    for name, t in zip(definition.outputs, outs, strict=False):
        if not isinstance(t, torch.Tensor) and not isinstance(t, _HONEST_MISTAKES):
            found.append(
                Violation("output-type", f"{name} is a {type(t).__qualname__} posing as a tensor")
            )
        elif isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
            found.append(
                Violation(
                    "output-type", f"{name} is a {type(t).__qualname__}, not a plain torch.Tensor"
                )
            )
        elif isinstance(t, torch.Tensor) and t.device != device:
            found.append(Violation("output-type", f"{name} is on {t.device}, expected {device}"))
        elif isinstance(t, torch.Tensor) and not dps and t.numel():
            lo, hi = _storage_range(t)
            shared = [n for n, (a, b) in ranges if lo < b and a < hi]
            if shared:
                aliases[name] = shared[0]
    return found


def _storage_range(t: Any) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    return bool(
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


__all__ = ["CHUNK_WORDS", "Untouched", "fingerprint", "output_violations"]
