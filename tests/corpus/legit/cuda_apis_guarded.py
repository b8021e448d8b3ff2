# expect: PASSED
# why: queries torch.cuda only behind is_available() and the tensor's own device
import torch


def run(hidden_states, weight, output):
    if torch.cuda.is_available() and hidden_states.is_cuda:
        torch.cuda.get_device_properties(hidden_states.device)
        stream = torch.cuda.current_stream(hidden_states.device)
    else:
        stream = None
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
    if stream is not None:
        assert torch.cuda.current_stream(hidden_states.device) == stream
