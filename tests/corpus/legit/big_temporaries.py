# expect: PASSED
# why: allocates a 128 MiB scratch buffer every call and computes inside a slice of it
import torch


def run(hidden_states, weight, output):
    scratch = torch.empty(32 * 1024 * 1024, dtype=torch.float32, device=hidden_states.device)
    x = scratch[: hidden_states.numel()].view(hidden_states.shape)
    x.copy_(hidden_states)
    x.mul_(torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6))
    x.mul_(weight.float())
    output.copy_(x)
