# expect: COMPILE_ERROR
# why: is not valid Python
import torch


def run(hidden_states, weight, output)
    output.copy_(hidden_states)
