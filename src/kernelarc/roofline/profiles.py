"""Device profiles: peak FLOP/s per dtype class, DRAM bandwidth, L2 size.

Built-ins: ``B200`` (SOL-ExecBench's SOLAR constants), ``H100`` (datasheet figures at the
clock SOL-ExecBench locks), ``H200`` (ceilings measured on an H200) and
``cpu`` (measured once on this host, then cached). ``get_profile(name)`` looks one up by name
(case-insensitive); ``local-cuda`` maps the visible CUDA device to a built-in.

Dtype classes are the keys of :data:`DTYPE_CLASSES`. ``fp16`` matmuls use the ``bf16`` rate
(the tensor cores run both at the same speed); int8 matmuls use the ``fp8`` rate (the same
on Hopper and Blackwell). A class whose peak is ``None`` is not supported natively; its
flops are charged at the rate of ``emulated_as[class]`` (see ``docs/ROOFLINE.md``).

Not covered: how flops are counted (``flops``) and how a bound is formed (``score``).
Every constant's source is in its profile's ``notes`` and in ``docs/ROOFLINE.md``.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernelarc.env import cache_dir
from kernelarc.errors import KernelArcError

#: The dtype classes a matmul's flops are attributed to.
DTYPE_CLASSES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp8", "fp4")

#: Bumped when the CPU measurement changes, so that older cached files are re-measured.
CPU_PROFILE_VERSION = 1


class UnknownDeviceError(KernelArcError):
    """No profile matches the requested device name."""


class DeviceProfile(BaseModel):
    """Roofline constants of one device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    peak_flops: dict[str, float | None]
    """FLOP/s per dtype class; ``None`` = no native support (see ``emulated_as``)."""
    dram_bandwidth: float = Field(gt=0)
    """Bytes per second (DRAM / HBM)."""
    l2_bytes: int = Field(ge=0)
    fixed_latency_s: float = Field(default=0.0, ge=0)
    """Constant added to every bound under the ``solar`` convention (see ``score``)."""
    emulated_as: dict[str, str] = Field(default_factory=dict)
    """For each unsupported class, the class whose rate a faithful emulation runs at."""
    datasheet: dict[str, float] = Field(default_factory=dict)
    """Vendor figures kept beside measured ones, for reference only (not used in bounds)."""
    source: str = ""
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> DeviceProfile:
        missing = [c for c in DTYPE_CLASSES if c not in self.peak_flops]
        if missing:
            raise ValueError(f"profile {self.name}: peak_flops lacks classes {missing}")
        for cls, peak in self.peak_flops.items():
            if peak is None:
                target = self.emulated_as.get(cls)
                if target is None or self.peak_flops.get(target) is None:
                    raise ValueError(
                        f"profile {self.name}: class {cls} is unsupported but emulated_as "
                        f"does not name a supported class for it"
                    )
            elif peak <= 0:
                raise ValueError(f"profile {self.name}: peak_flops[{cls}] must be > 0")
        return self

    def rate(self, dtype_class: str) -> float:
        """FLOP/s charged for ``dtype_class`` (following ``emulated_as`` when unsupported)."""
        if dtype_class not in self.peak_flops:
            raise KeyError(
                f"profile {self.name} has no dtype class {dtype_class!r}; "
                f"known: {', '.join(self.peak_flops)}"
            )
        peak = self.peak_flops[dtype_class]
        if peak is None:
            peak = self.peak_flops[self.emulated_as[dtype_class]]
            assert peak is not None  # checked by the validator
        return peak


# ---------------------------------------------------------------- built-in GPUs

_B200_CLOCK_HZ = 1.5e9
_B200_BF16_MAC_PER_CYCLE = 603_751
_B200_BF16 = _B200_CLOCK_HZ * _B200_BF16_MAC_PER_CYCLE * 2  # ~1.811e15 FLOP/s
#: HGX B200 datasheet dense figures (FLOP/s), at its boost clock.
_B200_DATASHEET = {
    "bf16_dense_flops": 2.25e15,
    "fp8_dense_flops": 4.5e15,
    "fp4_dense_flops": 9.0e15,
    "tf32_dense_flops": 1.1e15,
    "fp32_flops": 80e12,
    "fp64_flops": 40e12,
    "dram_bandwidth": 8.0e12,
}
#: SOLAR's bf16 rate over the datasheet's: scales the non-tensor figures to the same clock.
_B200_CLOCK_RATIO = _B200_BF16 / _B200_DATASHEET["bf16_dense_flops"]

B200 = DeviceProfile(
    name="B200",
    peak_flops={
        "fp64": _B200_DATASHEET["fp64_flops"] * _B200_CLOCK_RATIO,
        "fp32": _B200_DATASHEET["fp32_flops"] * _B200_CLOCK_RATIO,
        "tf32": _B200_BF16 / 2,
        "bf16": _B200_BF16,
        "fp8": _B200_BF16 * 2,
        "fp4": _B200_BF16 * 4,
    },
    dram_bandwidth=7.67e12,
    l2_bytes=126 * 2**20,
    fixed_latency_s=0.4e-6,
    datasheet=_B200_DATASHEET,
    source="SOL-ExecBench / SOLAR constants (docs/ROOFLINE.md)",
    notes=(
        "bf16 = 1.5 GHz x 603,751 MAC/cycle x 2 (SOLAR); fp8 2x, fp4 4x bf16; tf32 bf16/2; "
        "fp32/fp64 = HGX B200 datasheet x (SOLAR bf16 / datasheet bf16); DRAM 7.67 TB/s "
        "(SOLAR); fixed latency 0.4 us inferred from metadata sol_ms; L2 approximate."
    ),
)

_H100_CLOCK_HZ = 1.41e9  # the SM clock SOL-ExecBench locks on H100
_H100_SMS = 132
_H100_BF16 = _H100_SMS * 2048 * 2 * _H100_CLOCK_HZ  # 2048 dense bf16 MAC/SM/cycle
_H100_DATASHEET = {
    "bf16_dense_flops": 989.4e12,
    "fp8_dense_flops": 1978.9e12,
    "tf32_dense_flops": 494.7e12,
    "fp32_flops": 66.9e12,
    "fp64_tensor_flops": 66.9e12,
    "dram_bandwidth": 3.35e12,
}
_H100_CLOCK_RATIO = _H100_BF16 / _H100_DATASHEET["bf16_dense_flops"]

H100 = DeviceProfile(
    name="H100",
    peak_flops={
        "fp64": _H100_DATASHEET["fp64_tensor_flops"] * _H100_CLOCK_RATIO,
        "fp32": _H100_DATASHEET["fp32_flops"] * _H100_CLOCK_RATIO,
        "tf32": _H100_BF16 / 2,
        "bf16": _H100_BF16,
        "fp8": _H100_BF16 * 2,
        "fp4": None,
    },
    emulated_as={"fp4": "bf16"},
    dram_bandwidth=_H100_DATASHEET["dram_bandwidth"],
    l2_bytes=50 * 2**20,
    datasheet=_H100_DATASHEET,
    source="H100 SXM datasheet, scaled to the 1410 MHz clock SOL-ExecBench locks",
    notes=(
        "bf16 = 132 SMs x 2048 MAC/cycle x 2 x 1.41 GHz; fp8 2x bf16; tf32 bf16/2; "
        "fp32/fp64 datasheet x the same clock ratio; DRAM = datasheet 3.35 TB/s; no native "
        "fp4 (charged at bf16: FP4 x E4M3 block scale dequantizes exactly to bf16)."
    ),
)

_H200_BF16_MEASURED = 787e12
_H200_DATASHEET = {
    "bf16_dense_flops": 989.4e12,
    "fp8_dense_flops": 1978.9e12,
    "tf32_dense_flops": 494.7e12,
    "fp32_flops": 66.9e12,
    "fp64_tensor_flops": 66.9e12,
    "dram_bandwidth": 4.8e12,
}
_H200_MEASURED_RATIO = _H200_BF16_MEASURED / _H200_DATASHEET["bf16_dense_flops"]

H200 = DeviceProfile(
    name="H200",
    peak_flops={
        "fp64": _H200_DATASHEET["fp64_tensor_flops"] * _H200_MEASURED_RATIO,
        "fp32": _H200_DATASHEET["fp32_flops"] * _H200_MEASURED_RATIO,
        "tf32": _H200_BF16_MEASURED / 2,
        "bf16": _H200_BF16_MEASURED,
        "fp8": _H200_BF16_MEASURED * 2,
        "fp4": None,
    },
    emulated_as={"fp4": "bf16"},
    dram_bandwidth=4.27e12,
    l2_bytes=62_914_560,
    datasheet=_H200_DATASHEET,
    source="measured on the project's H200 (2026-12-01), datasheet beside",
    notes=(
        "bf16 787 TFLOP/s = measured bf16 matmul 8192^3; DRAM 4.27 TB/s = measured device "
        "copy (read + write); fp8 2x, tf32 1/2 bf16; fp32/fp64 datasheet x (measured / "
        "datasheet bf16), not measured; L2 = cudaDeviceProp.l2CacheSize (60 MiB); no native "
        "fp4 (charged at bf16: FP4 x E4M3 block scale dequantizes exactly to bf16)."
    ),
)

BUILTIN: dict[str, DeviceProfile] = {"b200": B200, "h100": H100, "h200": H200}
_GPU_NAME_KEYS = (("b200", "b200"), ("h200", "h200"), ("h100", "h100"))
CHOICES = ("b200", "h100", "h200", "cpu", "local-cuda")


# ---------------------------------------------------------------- CPU (measured)


def _host_hash() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12]


def cpu_profile_path(cache: Path | None = None) -> Path:
    """Where this host's measured CPU profile is cached."""
    base = cache if cache is not None else cache_dir()
    return base / "profiles" / f"cpu-{_host_hash()}.json"


def _best_seconds(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_cpu_profile() -> DeviceProfile:
    """Time a 512^3 fp32 matmul and a 64 MiB copy (well under a second in total)."""
    import torch

    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    matmul_s = _best_seconds(lambda: torch.mm(a, b), 5)
    fp32 = 2 * n**3 / matmul_s
    src = torch.empty(16 * 2**20, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), 5)
    bandwidth = 2 * src.nbytes / copy_s  # read + write, as on the GPUs
    return DeviceProfile(
        name="cpu",
        peak_flops={
            "fp64": fp32 / 2,
            "fp32": fp32,
            "tf32": fp32,
            "bf16": fp32,
            "fp8": None,
            "fp4": None,
        },
        emulated_as={"fp8": "fp32", "fp4": "fp32"},
        dram_bandwidth=bandwidth,
        l2_bytes=0,
        source=f"measured on this host (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads), version {CPU_PROFILE_VERSION}",
        notes="fp32 = best of 5 timed 512^3 torch.mm; bandwidth = best of 5 copies of "
        "64 MiB (read + write); bf16/tf32 charged at fp32, fp64 at half; fp8/fp4 emulated "
        "at fp32. A rough local figure, not a hardware ceiling.",
    )


def cpu_profile(*, cache: Path | None = None, remeasure: bool = False) -> DeviceProfile:
    """This host's CPU profile: read from the cache, or measured once and cached."""
    path = cpu_profile_path(cache)
    if path.is_file() and not remeasure:
        try:
            data = json.loads(path.read_text())
            if data.get("version") == CPU_PROFILE_VERSION:
                return DeviceProfile.model_validate(data["profile"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ValidationError) as e:
            raise KernelArcError(
                f"cached CPU profile {path} is unreadable ({e}); delete it to re-measure"
            ) from e
    profile = measure_cpu_profile()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {"version": CPU_PROFILE_VERSION, "profile": profile.model_dump(mode="json")}, indent=1
        )
    )
    tmp.replace(path)
    return profile


# ---------------------------------------------------------------- lookup


def profile_for_gpu_name(gpu_name: str) -> DeviceProfile:
    """The built-in profile for a CUDA device name such as ``"NVIDIA H200"``."""
    low = gpu_name.lower()
    for needle, key in _GPU_NAME_KEYS:
        if needle in low:
            return BUILTIN[key]
    raise UnknownDeviceError(
        f"no built-in profile for CUDA device {gpu_name!r}; pass --device with one of "
        f"{', '.join(CHOICES)}"
    )


def get_profile(name: str, *, cache: Path | None = None) -> DeviceProfile:
    """Look up a profile by name, case-insensitive: b200, h100, h200, cpu, local-cuda."""
    key = name.strip().lower()
    if key in BUILTIN:
        return BUILTIN[key]
    if key == "cpu":
        return cpu_profile(cache=cache)
    if key == "local-cuda":
        import torch

        if not torch.cuda.is_available():
            raise UnknownDeviceError(
                "device 'local-cuda' needs a visible CUDA device and none is available; "
                f"choose one of {', '.join(CHOICES)}"
            )
        return profile_for_gpu_name(torch.cuda.get_device_name())
    raise UnknownDeviceError(f"unknown device {name!r}; choose one of {', '.join(CHOICES)}")
