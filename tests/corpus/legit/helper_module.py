# expect: PASSED
# extra: _support/ka_rms_helper.py
# why: imports a second source file of the same solution as a plain module
import ka_rms_helper
import torch


def run(hidden_states, weight, output):
    x = hidden_states.to(torch.float32)
    output.copy_(x * ka_rms_helper.inverse_rms(x) * weight.to(torch.float32))
