# expect: PASSED
# why: splits the rows between two threads and joins both before returning
import threading

import torch


def _rows(hidden_states, weight, output, start, stop):
    x = hidden_states[start:stop].float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
    output[start:stop].copy_(y)


def run(hidden_states, weight, output):
    half = hidden_states.shape[0] // 2
    threads = [
        threading.Thread(target=_rows, args=(hidden_states, weight, output, 0, half)),
        threading.Thread(
            target=_rows, args=(hidden_states, weight, output, half, hidden_states.shape[0])
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
