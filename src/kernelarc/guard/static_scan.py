"""A static scan of a solution's sources, before it is built or loaded (``binary-load``).

Fires on over 8 KiB of base64/hex runs in one file (an embedded binary) and on driver-API
module loading (``cuModuleLoadData``, ``cuLibraryLoadData``, CuPy's ``RawModule``, ...).
Not covered: binaries assembled at run time from short pieces, or loaded through a route
the patterns do not name (the audit hook's ``ctypes`` rule still applies at run time).
"""

from __future__ import annotations

import re

from kernelarc.guard.sentinel import Violation

_ENCODED_RUN = re.compile(r"[A-Za-z0-9+/=]{60,}|(?:\\x[0-9a-fA-F]{2}){30,}")
_ENCODED_LIMIT = 8192
_DRIVER_LOADS = re.compile(
    r"cuModuleLoad(Data|DataEx|FatBinary)?\b|cuLibraryLoad(Data|FromFile)\b|"
    r"RawModule\s*\(|cupy\.cuda\.function\.Module|load_module_from_bytes"
)


def static_scan(sources: dict[str, str]) -> list[Violation]:
    """Look for embedded binaries (over 8 KiB of base64/hex runs in one file) and driver-API
    module loading in the solution's sources."""
    found: list[Violation] = []
    for path, text in sources.items():
        m = _DRIVER_LOADS.search(text)
        if m:
            found.append(Violation("binary-load", f"{path}: loads a module via {m.group(0)!r}"))
        encoded = sum(len(r) for r in _ENCODED_RUN.findall(text))
        if encoded > _ENCODED_LIMIT:
            found.append(Violation("binary-load", f"{path}: {encoded} bytes of encoded data"))
    return found
