# expect: PASSED
# why: loads the system C library with ctypes and calls abs (a system library, not a blob)
import ctypes

import torch

_LIBC = ctypes.CDLL("libc.so.6")


def run(hidden_states, weight, output):
    assert _LIBC.abs(-3) == 3
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
