# expect: RUNTIME_ERROR
# why: asks for 2**62 elements, which the allocator refuses at once (nothing is touched)
import torch


def run(hidden_states, weight, output):
    scratch = torch.empty(2**62, dtype=torch.uint8, device=hidden_states.device)
    output.copy_(scratch[: output.numel()].view(output.shape).to(output.dtype))
