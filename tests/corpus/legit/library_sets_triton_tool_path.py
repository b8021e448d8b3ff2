# expect: PASSED
# why: torch.compile on CUDA sets TRITON_PTXAS_PATH (its bundled ptxas) while compiling; a library's tool path is not tampering
import os

import torch

os.environ["TRITON_PTXAS_PATH"] = os.environ.get("TRITON_PTXAS_PATH", "ptxas")


def run(hidden_states, weight, output):
    os.environ["TRITON_PTXAS_PATH"] = os.environ["TRITON_PTXAS_PATH"]
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
