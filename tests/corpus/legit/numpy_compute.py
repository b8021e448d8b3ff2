# expect: PASSED
# why: computes the norm with numpy on host copies and copies the result back
import numpy as np
import torch


def run(hidden_states, weight, output):
    x = hidden_states.detach().float().cpu().numpy()
    w = weight.detach().float().cpu().numpy()
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32) + np.float32(1e-6))
    y = torch.from_numpy((x * inv * w).astype(np.float32))
    output.copy_(y.to(output.device))
