# expect: INCORRECT_NUMERICAL
# why: right everywhere except one NaN element (any NaN fails, whatever the ratio)
import torch


def run(hidden_states, weight, output):
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
    output[0, 0] = float("nan")
