# expect: PASSED
# why: uses FakeTensorMode only to plan shapes, then computes real values; torch itself sets
# TORCHINDUCTOR_CACHE_DIR in os.environ the first time, which must not count as env-tamper
import torch
from torch._subclasses.fake_tensor import FakeTensorMode


def _planned_shape(rows: int, cols: int) -> torch.Size:
    with FakeTensorMode():
        probe = torch.empty(rows, cols, dtype=torch.float32)
        return (probe * probe.mean(-1, keepdim=True)).shape


def run(hidden_states, weight, output):
    shape = _planned_shape(*hidden_states.shape)
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
    output.copy_(y.view(shape))
