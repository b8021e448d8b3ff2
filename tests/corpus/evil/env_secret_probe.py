# expect: PASSED
# why: looks for OPENAI_API_KEY (the test sets it in the parent); raises if it can see it
import os

import torch


def run(hidden_states, weight, output):
    if "OPENAI_API_KEY" in os.environ or os.getenv("OPENAI_API_KEY") is not None:
        raise RuntimeError("corpus: the parent's OPENAI_API_KEY leaked into the candidate")
    leaked = [k for k in os.environ if "API_KEY" in k.upper() or "TOKEN" in k.upper()]
    if leaked:
        raise RuntimeError(f"corpus: secret-looking variables leaked: {sorted(leaked)}")
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
