# expect: PASSED
# why: ctypes.util.find_library("m") (runs ldconfig/gcc, which the guard allows), then libm's cbrt
import ctypes
import ctypes.util

import torch


def run(hidden_states, weight, output):
    name = ctypes.util.find_library("m") or "libm.so.6"
    libm = ctypes.CDLL(name)
    libm.cbrt.restype = ctypes.c_double
    libm.cbrt.argtypes = [ctypes.c_double]
    assert abs(libm.cbrt(27.0) - 3.0) < 1e-12
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
