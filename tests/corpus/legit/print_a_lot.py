# expect: PASSED
# why: writes about 200 KB to stdout and stderr and raises a warning on every call
import sys
import warnings

import torch

_LINE = "corpus noise " + "x" * 87


def run(hidden_states, weight, output):
    for i in range(1000):
        print(i, _LINE)
        print(i, _LINE, file=sys.stderr)
    warnings.warn("corpus: a harmless warning", stacklevel=1)
    sys.stdout.flush()
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
