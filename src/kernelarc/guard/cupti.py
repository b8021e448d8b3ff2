"""GPU time of one call as CUPTI's activity records see it (as the official harness times).

:class:`ActivitySpan` brackets a block of host code. Inside it CUPTI records every kernel
(``CONCURRENT_KERNEL``, which also covers kernels of CUDA graphs), memory copy (``MEMCPY``)
and memset (``MEMSET``) launched by this process, on any stream. The span is
``last end - first start`` over those records: work moved to a side stream, or split over
several streams, counts; host time between launches before the first kernel does not.

The optional ``cupti-python`` package (``pip install kernelarc[cupti]``, module
``cupti.cupti``) provides the bindings. This module imports it, and torch, only when used,
so it imports fine without either. API used, from cupti-python's documented bindings:
``activity_register_callbacks(requested, completed)`` (``requested()`` returns
``(buffer_size_bytes, max_records)``, 0 meaning as many as fit; ``completed(records)``
receives the records of one buffer as Python objects with ``kind``, ``start``, ``end`` in
ns, ``correlation_id`` and, for kernels, ``name``), ``activity_enable(kind)``,
``activity_disable(kind)`` and ``activity_flush_all(flag)``. Checked on an H200 with
cupti-python 13.0.1 (CUPTI 13.0, torch 2.11 cu130): an 8192^3 bf16 matmul spans 1.40 ms
(its cuBLAS workspace memset included) where CUDA events read 1.51 ms.

How a span runs: ``__enter__`` synchronizes the device (so earlier work is not recorded as
overlapping), points CUPTI's buffer callbacks at this span and enables the kinds;
``__exit__`` synchronizes the device (all streams), force-flushes every buffer (each record
is copied into plain Python values inside the callback, since the buffer is reused) and
disables the kinds again. One span object can be entered many times; each entry starts
empty. Spans must not nest or overlap, in one thread or several: CUPTI has one set of
buffer callbacks per process.

Not covered: which launch a record belongs to (no correlation with API records: the whole
block is one call), activity of other processes, and dropped records (8 MiB buffers, more
on demand, hold tens of thousands of records per call).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

#: Bytes of each activity buffer handed to CUPTI.
BUFFER_BYTES = 8 * 1024 * 1024
#: ``CUPTI_ACTIVITY_FLAG_FLUSH_FORCED``: also flush buffers and records not yet complete.
_FLUSH_FORCED = 1
#: Activity kinds recorded: ``cupti.ActivityKind`` member name -> our label.
KINDS = {"CONCURRENT_KERNEL": "kernel", "MEMCPY": "memcpy", "MEMSET": "memset"}


class CuptiUnavailable(RuntimeError):
    """CUPTI timing was asked for where it cannot run."""


def _unavailable_reason() -> str | None:
    try:
        from cupti import cupti  # noqa: F401
    except Exception as e:  # ImportError, or OSError when libcupti cannot be loaded
        return (
            f"cannot import cupti-python ({type(e).__name__}: {e}); install it with "
            "`pip install cupti-python` (the kernelarc[cupti] extra)"
        )
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is visible to torch"
    except Exception as e:
        return f"cannot query CUDA through torch ({type(e).__name__}: {e})"
    return None


def cupti_unavailable_reason() -> str | None:
    """Why CUPTI timing cannot run here, or None when it can. Never raises."""
    return _unavailable_reason()


def cupti_available() -> bool:
    """True when cupti-python imports and a CUDA device exists. Never raises."""
    return _unavailable_reason() is None


def _load() -> ModuleType:
    reason = _unavailable_reason()
    if reason is not None:
        raise CuptiUnavailable(f"CUPTI timing is unavailable: {reason}")
    from cupti import cupti

    return cupti


@dataclass(frozen=True)
class ActivityRecord:
    """One GPU activity, copied out of CUPTI's buffer."""

    kind: str  # "kernel", "memcpy" or "memset"
    start_ns: int
    end_ns: int
    correlation_id: int
    name: str | None  # kernel name (mangled as CUPTI reports it); None for copies and sets


class ActivitySpan:
    """Context manager timing all GPU activity launched inside its block; see the module."""

    def __init__(self) -> None:
        self._records: list[ActivityRecord] = []
        self._labels: dict[int, str] = {}
        self._kinds: list[Any] = []
        self._active = False

    # -- CUPTI callbacks (may run on a CUPTI thread while the block runs)

    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        for a in activities:
            label = self._labels.get(int(a.kind))
            if label is None:
                continue
            name = None
            if label == "kernel":
                raw = a.name
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
            self._records.append(
                ActivityRecord(
                    kind=label,
                    start_ns=int(a.start),
                    end_ns=int(a.end),
                    correlation_id=int(a.correlation_id),
                    name=name,
                )
            )

    # -- context manager

    def __enter__(self) -> ActivitySpan:
        if self._active:
            raise RuntimeError("this ActivitySpan is already active: spans do not nest")
        cupti = _load()
        import torch

        torch.cuda.synchronize()
        kinds = [getattr(cupti.ActivityKind, n) for n in KINDS]
        self._labels = {int(getattr(cupti.ActivityKind, n)): lbl for n, lbl in KINDS.items()}
        self._records = []
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self._kinds = []
        try:
            for k in kinds:
                cupti.activity_enable(k)
                self._kinds.append(k)
        except Exception:
            self._disable(cupti)
            raise
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import torch
        from cupti import cupti

        self._active = False
        try:
            torch.cuda.synchronize()
            cupti.activity_flush_all(_FLUSH_FORCED)
        finally:
            self._disable(cupti)

    def _disable(self, cupti: ModuleType) -> None:
        kinds, self._kinds = self._kinds, []
        for k in reversed(kinds):
            cupti.activity_disable(k)

    # -- results of the last block

    @property
    def records(self) -> list[ActivityRecord]:
        """All records of the last block, in start order."""
        self._check_done()
        return sorted(self._records, key=lambda r: (r.start_ns, r.correlation_id))

    @property
    def span_ms(self) -> float:
        """Last end minus first start over all records of the last block, in ms."""
        self._check_done()
        if not self._records:
            raise RuntimeError(
                "no GPU activity (kernel, memcpy or memset) was recorded inside the span: "
                "the timed call launched nothing on the GPU"
            )
        start = min(r.start_ns for r in self._records)
        end = max(r.end_ns for r in self._records)
        return (end - start) / 1e6

    @property
    def kernel_names(self) -> list[str]:
        """Kernel names of the last block in launch order (by correlation id, then start)."""
        self._check_done()
        kernels = [r for r in self._records if r.kind == "kernel"]
        kernels.sort(key=lambda r: (r.correlation_id, r.start_ns))
        return [r.name or "" for r in kernels]

    def _check_done(self) -> None:
        if self._active:
            raise RuntimeError("read an ActivitySpan's results after its block has ended")
