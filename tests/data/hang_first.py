"""Batch size 1: sleeps for 1000 s (only the guard's deadline ends it). Otherwise correct."""

import time

import torch


def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    if hidden_states.shape[0] == 1:
        time.sleep(1000)
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
