# expect: INCORRECT_SHAPE
# dps: false
# why: returns the right values with one extra column
import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
    pad = torch.zeros(y.shape[0], 1, dtype=y.dtype, device=y.device)
    return torch.cat([y, pad], dim=1).to(hidden_states.dtype)
