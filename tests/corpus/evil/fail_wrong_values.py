# expect: INCORRECT_NUMERICAL
# why: scales the right answer by 1.1, far outside a 1e-2 tolerance
import torch


def run(hidden_states, weight, output):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
    output.copy_(y * 1.1)
