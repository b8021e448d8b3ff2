"""What both worker roles share (``worker.py``'s reference, ``candidate.py``'s candidate):
the device a worker runs on, the environment it reports, and one call's outputs in
definition order. The candidate's sentinel arms this module (its functions must not be
swapped by the solution)."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Sequence
from typing import Any


def environment_info(device: Any) -> dict[str, Any]:
    import torch

    libs = {"torch": torch.__version__, "python": platform.python_version()}
    with contextlib.suppress(Exception):
        import triton

        libs["triton"] = triton.__version__
    if device.type == "cuda":
        libs["cuda"] = str(torch.version.cuda)
        hardware = torch.cuda.get_device_name(device)
    else:
        hardware = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    return {"hardware": hardware, "libs": libs}


def resolve_device(name: str) -> Any:
    import torch

    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda was asked for but no CUDA device is visible")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        torch.cuda.init()
    else:
        # One intra-op thread in every worker (reference, candidate, warm spare): several
        # workers share the cores, and a multi-threaded op whose threads get preempted
        # stalls at its barrier, which made CPU timings swing by several times under load.
        torch.set_num_threads(1)
    return dev


def normalize_outputs(ret: Any, n: int, names: Sequence[str] = ()) -> tuple[Any, ...]:
    """The outputs of one call in definition order: a tuple/list as is, a dict keyed by
    exactly the definition's output names in that order, anything else as one output."""
    if isinstance(ret, dict) and names and set(ret) == set(names):
        return tuple(ret[k] for k in names)
    if n == 1 and not isinstance(ret, tuple | list):
        return (ret,)
    if isinstance(ret, tuple | list):
        return tuple(ret)
    return (ret,)
