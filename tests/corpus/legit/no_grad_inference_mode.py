# expect: PASSED
# why: wraps the work in torch.no_grad and torch.inference_mode and reads inputs via views
import torch


@torch.no_grad()
def run(hidden_states, weight, output):
    with torch.inference_mode():
        x = hidden_states.view(-1, hidden_states.shape[-1]).float()
        w = weight.view(1, -1).float()
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w
    output.copy_(y.view(output.shape))
