# expect: PASSED
# why: destination-passing style that also returns the output tensor (the return is ignored)
import torch


def run(hidden_states, weight, output):
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
    return output
