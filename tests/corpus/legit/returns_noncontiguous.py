# expect: PASSED
# dps: false
# why: returns correct values in a column-major (non-contiguous) bfloat16 tensor
import torch


def run(hidden_states, weight):
    x = hidden_states.float()
    y = (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()).bfloat16()
    out = y.t().contiguous().t()
    assert not out.is_contiguous() or out.shape[0] == 1
    return out
