# expect: PASSED
# why: walks the rows in chunks of two through read-only views of the input
import torch


def run(hidden_states, weight, output):
    w = weight.float()
    for start in range(0, hidden_states.shape[0], 2):
        x = hidden_states[start : start + 2].float()
        output[start : start + 2] = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w
