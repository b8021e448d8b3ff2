# expect: PASSED
# why: changes torch's intra-op thread count (native threads, global torch state) and computes
import torch


def run(hidden_states, weight, output):
    torch.set_num_threads(1)
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
