"""Prints `KA-CALL @TAG@ batch=N` on every call (the worker's stdout is its log file), so a
test can tell which worker process served which call. With the tag `fail`, batch size 1
raises; everything else is a correct RMSNorm."""

import torch

TAG = "@TAG@"


def run(hidden_states: torch.Tensor, weight: torch.Tensor, output: torch.Tensor) -> None:
    print(f"KA-CALL {TAG} batch={hidden_states.shape[0]}", flush=True)
    if TAG == "fail" and hidden_states.shape[0] == 1:
        raise RuntimeError("ka-test deliberate failure")
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
