"""Large output tensors handed from a candidate worker to the reference worker on the GPU.

On by default on CUDA (``GuardConfig.gpu_exchange``). The file exchange
(``protocol.SlotWriter``) copies every output through a shared-memory file; for a problem
whose outputs are tens of GB that costs seconds per correctness round (docs/GUARD.md). Here
an output of at least ``IPC_MIN_BYTES`` crosses as a CUDA IPC handle instead (driver API
through ``ctypes``: ``cuIpcGetMemHandle`` in the candidate worker, ``cuIpcOpenMemHandle`` in
the reference worker), and the reference worker copies it into its own memory at once and
closes the handle.

The reference worker must not run in a PID namespace of its own when the candidate does:
both are then PID 1 of their namespaces and the driver refuses the handle (error 201,
CUDA_ERROR_INVALID_CONTEXT; presumably it takes the handle for one of the reader's own).
Measured on the H200, 2026-12-02 (``benchmarks/ipc_probe.py --pairs``): every pair of
isolation levels opens, except both sides under ``unshare --pid``. The guard therefore
starts the reference worker without namespaces while this exchange is on
(``Guard._isolation_of``).

What the reference worker trusts: nothing of the header. The handle is opened by the driver
(a forged one fails to open); the allocation's real extent is asked of the driver
(``cuMemGetAddressRange``) and the header's offset and size must lie inside it; dtype and
shape go through the same allow-list as the file headers. A failure to open is an
:class:`ExchangeUnavailable` (the environment may forbid CUDA IPC): the guard then judges
with files again, it never rejects a candidate for it.

Not covered: while the reference worker copies, the memory belongs to the candidate's process;
that process is then blocked in the guard's request loop after a device synchronise, and
threads or child processes left behind are reward hacks found by the sentinel, so nothing of
the candidate runs to change it. The copy needs the tensor's size in free device memory once.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

#: Outputs at least this large cross on the GPU (smaller ones through files, as before).
IPC_MIN_BYTES = 256 << 20

_HANDLE_BYTES = 64
_LAZY_PEER_ACCESS = 1


class ExchangeUnavailable(RuntimeError):
    """CUDA IPC cannot be used here (driver missing, or the handle does not open)."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _HANDLE_BYTES)]


class _Driver:
    """The driver calls used, from ``libcuda.so.1`` (loaded on first use), with their
    argument types declared (the handle is passed by value). Driver calls, unlike the
    runtime's, leave no error behind for torch's next launch check to raise."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise ExchangeUnavailable(f"libcuda.so.1 not loadable: {e}") from e
        u64, ptr64 = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
        sigs = {
            "cuMemGetAddressRange_v2": [ptr64, ctypes.POINTER(ctypes.c_size_t), u64],
            "cuIpcGetMemHandle": [ctypes.POINTER(_Handle), u64],
            "cuIpcOpenMemHandle_v2": [ptr64, _Handle, ctypes.c_uint],
            "cuIpcCloseMemHandle": [u64],
            "cuMemHostRegister_v2": [u64, ctypes.c_size_t, ctypes.c_uint],
            "cuMemHostUnregister": [u64],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        self.lib = lib

    def _call(self, name: str, *args: Any) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise ExchangeUnavailable(f"{name} failed with CUDA driver error {rc}")

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        self._call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ptr)
        return int(base.value), int(size.value)

    def get_handle(self, base: int) -> bytes:
        h = _Handle()
        self._call("cuIpcGetMemHandle", ctypes.byref(h), base)
        return ctypes.string_at(ctypes.addressof(h), _HANDLE_BYTES)

    def open_handle(self, handle: bytes) -> int:
        h = _Handle()
        ctypes.memmove(ctypes.addressof(h), handle, _HANDLE_BYTES)
        ptr = ctypes.c_uint64(0)
        self._call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), h, _LAZY_PEER_ACCESS)
        return int(ptr.value)

    def close_handle(self, ptr: int) -> None:
        self._call("cuIpcCloseMemHandle", ptr)


def _attempt(name: str, *args: Any) -> str | None:
    """One driver call; None when it succeeded, else why not."""
    try:
        _Driver()._call(name, *args)
    except ExchangeUnavailable as e:
        return str(e)
    return None


def host_register(ptr: int, nbytes: int) -> str | None:
    """Page-lock host memory for the current CUDA context; None when done, else why not.
    (The runtime's ``cudaHostRegister``, failing, left its error to be raised by the next
    kernel launch: a pageable fallback then crashed on the H200, 2026-12-02.)"""
    return _attempt("cuMemHostRegister_v2", ptr, nbytes, 0)


def host_unregister(ptr: int) -> str | None:
    """Undo :func:`host_register`; None when done, else why not."""
    return _attempt("cuMemHostUnregister", ptr)


@dataclass
class Exporter:
    """Candidate side: exported tensors stay alive until :meth:`release` (the worker calls
    it before its next request, when the reference worker has copied them)."""

    held: list[Any] = field(default_factory=list)
    _driver: _Driver | None = None

    def wanted(self, t: Any) -> bool:
        return bool(t.is_cuda) and t.numel() * t.element_size() >= IPC_MIN_BYTES

    def export(self, t: Any, dtype_name: str) -> dict[str, Any]:
        import torch

        if self._driver is None:
            self._driver = _Driver()
        c = t.detach().contiguous()
        with torch.cuda.device(c.device):
            torch.cuda.synchronize(c.device)  # the other process reads it without our stream
            ptr = c.data_ptr()
            base, _ = self._driver.address_range(ptr)
            handle = self._driver.get_handle(base)
        self.held.append(c)
        return {
            "ipc": handle.hex(),
            "offset": ptr - base,
            "dtype": dtype_name,
            "shape": list(c.shape),
            "nbytes": c.numel() * c.element_size(),
        }

    def release(self) -> None:
        self.held.clear()


class _Raw:
    """A device byte range in the ``__cuda_array_interface__`` form torch wraps without a
    copy."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
        }


def read_ipc(header: dict[str, Any], dtype: Any, shape: list[int], nbytes: int, device: Any) -> Any:
    """A private copy, in this process's memory, of the tensor a header exported. Raises
    ``ValueError`` when the header does not describe memory inside the exported allocation,
    :class:`ExchangeUnavailable` when the handle does not open."""
    import torch

    text = header.get("ipc")
    offset = header.get("offset")
    if not isinstance(text, str) or len(text) != 2 * _HANDLE_BYTES:
        raise ValueError("bad CUDA IPC handle in header")
    try:
        handle = bytes.fromhex(text)
    except ValueError as e:
        raise ValueError("bad CUDA IPC handle in header") from e
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"bad offset in header: {offset!r}")
    if header.get("nbytes") != nbytes:
        raise ValueError(f"header says {header.get('nbytes')!r} bytes, its shape implies {nbytes}")
    drv = _Driver()
    dev = torch.device(device)
    with torch.cuda.device(dev):
        torch.cuda.synchronize(dev)  # makes the device's context current (the driver needs one)
        ptr = drv.open_handle(handle)
        try:
            base, size = drv.address_range(ptr)
            if ptr + offset + nbytes > base + size:
                raise ValueError(
                    f"header claims {nbytes} bytes at offset {offset}; the exported "
                    f"allocation holds {size - (ptr - base)}"
                )
            view = torch.as_tensor(_Raw(ptr + offset, nbytes), device=dev)
            private = view.clone()
            torch.cuda.synchronize(dev)
            del view
        finally:
            drv.close_handle(ptr)
    return private.view(dtype).reshape(shape)
