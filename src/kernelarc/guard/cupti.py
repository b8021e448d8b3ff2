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
overlapping), force-flushes and discards what was recorded before, and starts collecting;
``__exit__`` synchronizes the device (all streams), force-flushes every buffer (each record
is copied into plain Python values inside the callback, since the buffer is reused) and
stops collecting. Enabling CUPTI activity is costly and perturbs the first launches after
it, so a timing loop opens one :meth:`ActivitySpan.session` (register the callbacks, enable
the kinds once) and enters the span once per call inside it; a span entered outside a
session enables and disables the kinds around its own block. One span object can be
entered many times; each entry starts empty. Spans must not nest or overlap, in one thread
or several: CUPTI has one set of buffer callbacks per process.

Not covered: which launch a record belongs to (no correlation with API records: the whole
block is one call), activity of other processes, and dropped records (8 MiB buffers, more
on demand, hold tens of thousands of records per call).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from contextlib import contextmanager
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
    stream_id: int | None = None


def _stream_id(a: Any) -> int | None:
    sid = getattr(a, "stream_id", None)
    return int(sid) if sid is not None else None


class ActivitySpan:
    """Context manager timing all GPU activity launched inside its block; see the module."""

    def __init__(self) -> None:
        self._records: list[ActivityRecord] = []
        self._labels: dict[int, str] = {}
        self._kinds: list[Any] = []
        self._active = False
        self._collecting = False
        self._in_session = False

    # -- CUPTI callbacks (may run on a CUPTI thread while the block runs)

    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        if not self._collecting:
            return  # work from before the block (flushes, poisoning between calls)
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
                    stream_id=_stream_id(a),
                )
            )

    # -- session and context manager

    def _enable(self) -> ModuleType:
        cupti = _load()
        kinds = [getattr(cupti.ActivityKind, n) for n in KINDS]
        self._labels = {int(getattr(cupti.ActivityKind, n)): lbl for n, lbl in KINDS.items()}
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self._kinds = []
        try:
            for k in kinds:
                cupti.activity_enable(k)
                self._kinds.append(k)
        except Exception:
            self._disable(cupti)
            raise
        return cupti

    @contextmanager
    def session(self) -> Iterator[ActivitySpan]:
        """Enable CUPTI activity once for many entries of this span (a timing loop)."""
        if self._in_session or self._active:
            raise RuntimeError("this ActivitySpan is already in a session or active")
        cupti = self._enable()
        self._in_session = True
        try:
            yield self
        finally:
            self._in_session = False
            try:
                import torch

                torch.cuda.synchronize()
                cupti.activity_flush_all(_FLUSH_FORCED)  # a CallLog collects these
            finally:
                self._collecting = False
                self._disable(cupti)

    def __enter__(self) -> ActivitySpan:
        if self._active:
            raise RuntimeError("this ActivitySpan is already active: spans do not nest")
        cupti = _load() if self._in_session else self._enable()
        import torch

        try:
            torch.cuda.synchronize()
            self._collecting = False
            cupti.activity_flush_all(_FLUSH_FORCED)
        except Exception:
            if not self._in_session:
                self._disable(cupti)
            raise
        self._records = []
        self._collecting = True
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
            self._collecting = False
            if not self._in_session:
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


class CallLog:
    """Spans of many calls from one CUPTI session, flushed once at the end.

    Flushing CUPTI after every call costs milliseconds and makes CUPTI allocate a fresh
    buffer at the first record of the next call, which delays that call's second launch
    (measured on the H200: +450 µs on a two-kernel call, see docs/PERFORMANCE.md). Here
    instead every call is bracketed by two *marker* kernels on a stream private to this
    log, each launched after a device synchronisation, so they never overlap the call.
    Correlation ids are assigned in host launch order, so the records of call ``i`` are the
    ones whose correlation id lies strictly between its two markers; the markers are told
    apart from the call's own work by their stream. Use::

        with CallLog() as log:
            for ...:
                log.begin(); call(); sync; log.end()
        log.spans_ms  # one span per call, None where the call recorded no GPU activity

    Not covered: work launched by another host thread of the process between the markers
    counts for the call (the guard rejects calls that leave threads running).
    """

    def __init__(self) -> None:
        self._span = ActivitySpan()
        self._stream: Any = None
        self._buf: Any = None
        self._stack: Any = None
        self._sid: int | None = None
        self._n = 0
        self.spans_ms: list[float | None] = []

    def _mark(self) -> None:
        import torch

        with torch.cuda.stream(self._stream):
            self._buf.add_(1)
        self._stream.synchronize()

    def __enter__(self) -> CallLog:
        import contextlib

        import torch

        self._stream = torch.cuda.Stream()
        self._buf = torch.zeros(1, dtype=torch.int32, device="cuda")
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self._span.session())
        try:
            # Calibrate: one marker alone tells which CUPTI stream id the markers carry.
            torch.cuda.synchronize()
            cupti = _load()
            cupti.activity_flush_all(_FLUSH_FORCED)
            self._span._records = []
            self._span._collecting = True
            self._mark()
            cupti.activity_flush_all(_FLUSH_FORCED)
            kernels = [r for r in self._span._records if r.kind == "kernel"]
            if len(kernels) != 1 or kernels[0].stream_id is None:
                raise RuntimeError(
                    f"CUPTI calibration saw {len(kernels)} marker kernels"
                    + (" without a stream id" if kernels and kernels[0].stream_id is None else "")
                )
            self._sid = kernels[0].stream_id
            self._span._records = []
        except BaseException:
            stack, self._stack = self._stack, None
            stack.close()
            raise
        self._n = 0
        return self

    def begin(self) -> None:
        self._mark()

    def end(self) -> None:
        self._mark()
        self._n += 1

    def peek(self) -> list[float | None]:
        """Spans of the calls bracketed so far, read mid-session: synchronises the device
        and force-flushes CUPTI once. The flush makes CUPTI allocate a fresh buffer at the
        next record, which delays the next call (see the class docstring), so the caller
        runs one untimed call after a peek."""
        import torch

        torch.cuda.synchronize()
        _load().activity_flush_all(_FLUSH_FORCED)
        return self._partition(list(self._span._records))

    def __exit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)  # synchronises, flushes every record, disables CUPTI
        if exc[0] is None:
            self.spans_ms = self._partition(list(self._span._records))

    def _partition(self, records: list[ActivityRecord]) -> list[float | None]:
        marks = sorted(
            r.correlation_id for r in records if r.kind == "kernel" and r.stream_id == self._sid
        )
        if len(marks) != 2 * self._n:
            raise RuntimeError(
                f"found {len(marks)} marker records for {self._n} bracketed calls: records "
                "were lost or the calls used the markers' stream"
            )
        by_id = sorted(records, key=lambda r: r.correlation_id)
        ids = [r.correlation_id for r in by_id]
        spans: list[float | None] = []
        for i in range(self._n):
            lo, hi = marks[2 * i], marks[2 * i + 1]
            inside = by_id[bisect.bisect_right(ids, lo) : bisect.bisect_left(ids, hi)]
            if not inside:
                spans.append(None)
                continue
            start = min(r.start_ns for r in inside)
            end = max(r.end_ns for r in inside)
            spans.append((end - start) / 1e6)
        return spans
