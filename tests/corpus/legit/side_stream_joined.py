# expect: PASSED
# why: on CUDA, works on a side stream and makes the current stream wait for it (joined)
import torch


def _rms(hidden_states, weight, output):
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())


def run(hidden_states, weight, output):
    if not hidden_states.is_cuda:
        _rms(hidden_states, weight, output)
        return
    current = torch.cuda.current_stream(hidden_states.device)
    side = torch.cuda.Stream(hidden_states.device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        _rms(hidden_states, weight, output)
    current.wait_stream(side)
    for t in (hidden_states, weight, output):
        t.record_stream(side)
