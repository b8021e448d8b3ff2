# expect: PASSED
# why: Inductor asks nvidia-smi for the GPU's clocks while it compiles (read-only query flags only); the binary may be absent (CPU machines)
import subprocess

import torch


def _max_sm_clock() -> str:
    cmd = ["nvidia-smi", "-i", "0", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"]
    try:
        return subprocess.run(cmd, check=False, capture_output=True, text=True).stdout
    except OSError:
        return ""


def run(hidden_states, weight, output):
    _max_sm_clock()
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
