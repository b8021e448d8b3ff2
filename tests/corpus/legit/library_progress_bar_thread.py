# expect: PASSED
# why: shows a tqdm progress bar on first use (tqdm starts its monitor daemon thread and keeps
# it, as torch.compile's progress bar does); a library's own thread is not the candidate's
import io

import torch
import tqdm


def run(hidden_states, weight, output):
    bar = tqdm.tqdm(total=1, file=io.StringIO(), mininterval=0)
    x = hidden_states.float()
    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight.float())
    bar.update()
    bar.close()
