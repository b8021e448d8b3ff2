# expect: INCORRECT_DTYPE
# dps: false
# why: returns the right values in float32 instead of bfloat16
import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
