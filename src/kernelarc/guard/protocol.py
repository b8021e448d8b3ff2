"""The wire between the guard and its workers: JSON lines on dedicated pipes, tensors as
raw bytes in files.

Nothing a candidate process sends is ever unpickled: requests and replies are JSON objects,
one per line; an output tensor crosses as a file of raw bytes plus a JSON header (dtype name
from an allow-list, shape), which the judging side re-assembles with ``torch.frombuffer``.
The candidate's own stdout/stderr go to a log file, never to the channel.

Also here: the seed protocol (a fixed base seed, one derived seed per workload and round).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelarc.guard.cuda_ipc import host_register, host_unregister, read_ipc

MAX_LINE = 64 * 1024 * 1024

#: dtype names accepted on the wire → torch attribute names (resolved lazily).
WIRE_DTYPES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1fn_x2",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)

#: Round numbers with a fixed meaning in the seed protocol.
RECHECK_ROUND = 10_000
POOL_ROUND_BASE = 20_000
#: The round of the compile pass's one call per workload (``compile_pool.py``).
WARM_ROUND = 30_000
#: The parts of a correctness round in the candidate's worker, as its ``run`` reply's
#: ``phases_s`` gives them (diagnostics): making the inputs, recording their state (copies,
#: fingerprints), the call, the checks after it (writes, outputs), writing the outputs.
ROUND_PARTS = ("inputs", "state", "call", "checks", "write")


def derive_seed(base_seed: int, workload_uuid: str, round_index: int) -> int:
    """Seed of one round of one workload: fixed for (base seed, uuid, round), different
    across rounds, independent of which other workloads are evaluated."""
    digest = hashlib.sha256(f"{base_seed}:{workload_uuid}:{round_index}".encode()).digest()
    return int.from_bytes(digest[:6], "little")


class ChannelClosed(EOFError):
    """The other end closed its pipe (it exited or crashed)."""


class ChannelTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


@dataclass
class Channel:
    """One direction-pair of pipes carrying JSON objects, one per line."""

    read_fd: int
    write_fd: int

    def __post_init__(self) -> None:
        self._buf = b""

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, allow_nan=True) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.write_fd, view)
            view = view[n:]

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout("no reply before the deadline")
                ready, _, _ = select.select([self.read_fd], [], [], min(left, 1.0))
                if not ready:
                    continue
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise ChannelClosed("the peer closed the channel")
            self._buf += chunk
            if len(self._buf) > MAX_LINE:
                raise ValueError("message larger than the protocol allows")
        line, self._buf = self._buf.split(b"\n", 1)
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("protocol message is not a JSON object")
        return obj

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


# ---------------------------------------------------------------- tensors as files


class SlotWriter:
    """Writes output tensors into shared-memory files, one file per output slot, reused.

    On CUDA each slot's file stays mapped and, where the driver allows it, page-locked
    (``cuMemHostRegister``), so a device-to-host copy lands in the file by DMA with no extra
    copy and no page faults. A slot's file is re-created only when its size changes. A
    failed page-lock costs speed only (plain pageable copy) and is logged to stderr.
    Owned by one worker; :meth:`close` unregisters and unmaps everything.
    """

    def __init__(self) -> None:
        self._maps: dict[str, tuple[Any, bool]] = {}

    def _slot(self, path: Path, nbytes: int, cuda: bool) -> Any:
        import torch

        key = str(path)
        cached = self._maps.get(key)
        if cached is not None and cached[0].numel() == nbytes and path.exists():
            return cached[0]
        self._drop(key)
        with open(path, "wb") as f:
            f.truncate(nbytes)
        dst = torch.from_file(key, shared=True, size=nbytes, dtype=torch.uint8)
        pinned = False
        if cuda:
            err = host_register(dst.data_ptr(), nbytes)
            pinned = err is None
            if not pinned:
                print(f"kernelarc: page-locking {path.name} failed ({err}); copying pageable")
        self._maps[key] = (dst, pinned)
        return dst

    def _drop(self, key: str) -> None:
        old = self._maps.pop(key, None)
        if old is not None and old[1]:
            err = host_unregister(old[0].data_ptr())
            if err is not None:
                print(f"kernelarc: unlocking {Path(key).name} failed ({err})")

    def write(self, t: Any, path: Path) -> dict[str, Any]:
        """Write a plain tensor's bytes to ``path``; return its header."""
        import torch

        name = str(t.dtype).removeprefix("torch.")
        if name not in WIRE_DTYPES:
            raise ValueError(f"dtype {t.dtype} cannot cross the wire")
        c = t.detach().contiguous()
        nbytes = c.numel() * c.element_size()
        if nbytes:
            dst = self._slot(path, nbytes, c.is_cuda)
            dst.copy_(c.reshape(-1).view(torch.uint8))
        else:
            self._drop(str(path))
            with open(path, "wb"):
                pass
        return {"file": str(path), "dtype": name, "shape": list(c.shape), "nbytes": nbytes}

    def close(self) -> None:
        for key in list(self._maps):
            self._drop(key)


#: Files at least this large are read from a mapping kept between rounds (SlotReader).
MAPPED_READ_BYTES = 64 << 20


class SlotReader:
    """The judging side of :class:`SlotWriter`: a large file (``MAPPED_READ_BYTES``) stays
    mapped between rounds, so a round's device copy does not map and fault its pages in
    again; the mapping is renewed when the file is replaced (another inode or size). It is
    not page-locked: a locked mapping keeps the pages it had when locked, and a file
    truncated and written again (a new candidate worker re-creating its slot) would then
    be read stale (suspected in the first H200 run of a page-locked version, where a
    candidate's outputs read as garbage). Everything else goes to :func:`read_tensor`."""

    def __init__(self) -> None:
        self._maps: dict[str, tuple[tuple[int, int], Any]] = {}

    def read(self, header: dict[str, Any], device: Any) -> Any:
        import torch

        path = Path(str(header.get("file")))
        dev = torch.device(device)
        if "ipc" in header or dev.type != "cuda":
            return read_tensor(header, device)
        st = path.stat()
        if st.st_size < MAPPED_READ_BYTES:
            return read_tensor(header, device)
        dtype, shape, nbytes = header_layout(header)
        if st.st_size != nbytes:
            raise ValueError(f"{path.name}: {st.st_size} bytes, header implies {nbytes}")
        key, ident = str(path), (st.st_ino, st.st_size)
        cached = self._maps.get(key)
        if cached is None or cached[0] != ident:
            src = torch.from_file(key, shared=True, size=nbytes, dtype=torch.uint8)
            cached = (ident, src)
            self._maps[key] = cached
        out = cached[1].to(dev)  # a private device copy
        return out.view(dtype).reshape(shape)

    def close(self) -> None:
        self._maps.clear()


def header_layout(header: dict[str, Any]) -> tuple[Any, list[int], int]:
    """(torch dtype, shape, byte count) a tensor header describes, validated."""
    import torch

    name = header.get("dtype")
    if name not in WIRE_DTYPES:
        raise ValueError(f"header names dtype {name!r}, not on the allow-list")
    dtype = getattr(torch, str(name))
    shape = header.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"bad shape in header: {shape!r}")
    numel = 1
    for d in shape:
        numel *= d
    return dtype, shape, numel * torch.empty(0, dtype=dtype).element_size()


def read_tensor(header: dict[str, Any], device: Any) -> Any:
    """Re-assemble a tensor written by :meth:`SlotWriter.write` (or exported by
    ``cuda_ipc.Exporter``), validating the header."""
    import torch

    dtype, shape, nbytes = header_layout(header)
    if "ipc" in header:  # a large CUDA output handed over on the GPU (guard/cuda_ipc.py)
        if torch.device(device).type != "cuda":
            raise ValueError("a CUDA IPC header for a device that is not CUDA")
        return read_ipc(header, dtype, shape, nbytes, device)
    path = Path(str(header.get("file")))
    size = path.stat().st_size
    if size != nbytes:
        raise ValueError(f"{path.name}: {size} bytes, header implies {nbytes}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    if torch.device(device).type == "cuda":
        # Straight from the file's pages to the device: the device copy is private.
        raw = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        return raw.to(device).view(dtype).reshape(shape)
    # On the CPU a private copy (read, not mapped): the writer cannot change it afterwards.
    raw = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)
