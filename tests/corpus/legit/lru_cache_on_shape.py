# expect: PASSED
# why: caches a shape-derived constant (1/hidden_size) with functools.lru_cache, never data
import functools

import torch


@functools.lru_cache(maxsize=8)
def _inv_hidden(hidden_size: int, device: str) -> torch.Tensor:
    return torch.tensor(1.0 / hidden_size, dtype=torch.float32, device=device)


def run(hidden_states, weight, output):
    x = hidden_states.float()
    mean_sq = x.square().sum(-1, keepdim=True) * _inv_hidden(x.shape[-1], str(x.device))
    output.copy_(x * torch.rsqrt(mean_sq + 1e-6) * weight.float())
