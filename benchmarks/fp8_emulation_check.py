"""FP8 ``_scaled_mm``: the native kernel of this GPU vs the emulation (problem/emulation.py).

    python benchmarks/fp8_emulation_check.py

Per-tensor and row-wise scales, a small and a long-K shape. Prints the worst difference
relative to the sum of |products| (the scale of a reduced-precision accumulation error),
the worst relative difference, and the fraction of bfloat16 outputs that differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from kernelarc.problem import emulation as emu

E4M3 = torch.float8_e4m3fn


def scales(kind: str, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "per-tensor":
        return torch.tensor(0.37, device="cuda"), torch.tensor(1.9, device="cuda")
    sa = torch.linspace(0.1, 2.0, m, device="cuda").reshape(m, 1)
    return sa, torch.linspace(0.5, 3.0, n, device="cuda").reshape(1, n)


def main() -> None:
    gen = torch.Generator().manual_seed(3)
    for m, n, k in [(64, 48, 96), (256, 256, 4096)]:
        a = (torch.randn(m, k, generator=gen) * 3).to(E4M3).cuda()
        b = (torch.randn(n, k, generator=gen) * 3).to(E4M3).cuda().t()
        for kind in ("per-tensor", "row-wise"):
            sa, sb = scales(kind, m, n)
            native = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32).double()
            emulated = emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.float32).double()
            mag = (a.float().abs() @ b.float().abs()).double() * (sa * sb).double()
            err = (native - emulated).abs()
            n16 = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
            e16 = emu.emulated_scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
            print(
                f"fp8 {kind:10s} {m}x{n}x{k}: max |native-emulated| / sum|products| "
                f"{float((err / mag).max()):.2e}; max relative "
                f"{float((err / emulated.abs().clamp_min(1e-9)).max()):.2e}; "
                f"bf16 outputs differing {float((n16 != e16).float().mean()):.2%}"
            )


if __name__ == "__main__":
    main()
