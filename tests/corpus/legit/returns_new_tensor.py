# expect: PASSED
# dps: false
# why: value-returning style: builds and returns a fresh bfloat16 tensor
import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
    return y.to(hidden_states.dtype)
