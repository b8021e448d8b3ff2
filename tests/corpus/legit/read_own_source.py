# expect: PASSED
# why: reads its own source file through __file__ (a solution may read its own files)
from pathlib import Path

import torch

_OWN_SOURCE = Path(__file__).read_text(encoding="utf-8")


def run(hidden_states, weight, output):
    if Path(__file__).read_text(encoding="utf-8") != _OWN_SOURCE or "def run" not in _OWN_SOURCE:
        raise RuntimeError("corpus: could not read back this solution's own source file")
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
