"""Batch size 1: reads address 0 (SIGSEGV in the worker). Otherwise a correct RMSNorm."""

import ctypes

import torch


def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    if hidden_states.shape[0] == 1:
        ctypes.string_at(0)
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
