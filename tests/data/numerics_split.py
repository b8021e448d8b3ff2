"""Batch size 1: 10 % too large (INCORRECT_NUMERICAL). Otherwise RMSNorm computed in bfloat16:
small, input-dependent rounding errors inside the tolerance (PASSED, non-zero errors)."""

import torch


def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    if hidden_states.shape[0] == 1:
        x = hidden_states.float()
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
        output.copy_(y * 1.1)
        return
    x = hidden_states
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight)
