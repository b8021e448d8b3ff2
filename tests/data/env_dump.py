"""Correct values; on every call writes its whole environment (names and values, as JSON) to
the file @OUT@ (a temporary path the test fills in)."""

import json
import os

import torch

OUT = "@OUT@"


def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    with open(OUT, "w") as f:
        json.dump({"names": sorted(os.environ), "values": sorted(os.environ.values())}, f)
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
