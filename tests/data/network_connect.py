"""Correct values, but tries a TCP connection to 127.0.0.1:9 in every call."""

import socket

import torch


def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1).close()
    except OSError:
        pass
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
