# expect: PASSED
# why: uses a ThreadPoolExecutor inside a with-block, which waits for and stops its threads
from concurrent.futures import ThreadPoolExecutor

import torch


def _row(hidden_states, weight, output, i):
    x = hidden_states[i].float()
    output[i].copy_(x * torch.rsqrt(x.square().mean() + 1e-6) * weight.float())


def run(hidden_states, weight, output):
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda i: _row(hidden_states, weight, output, i), range(len(output))))
