# expect: PASSED
# why: reads os.environ into a private dict and edits only the copy
import os

import torch


def run(hidden_states, weight, output):
    before = os.environ.get("CUDA_LAUNCH_BLOCKING")
    env = dict(os.environ)
    env["CUDA_LAUNCH_BLOCKING"] = "1"
    env.pop("PATH", None)
    if os.environ.get("CUDA_LAUNCH_BLOCKING") != before:
        raise RuntimeError("corpus: editing a copy changed os.environ")
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
