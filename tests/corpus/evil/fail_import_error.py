# expect: COMPILE_ERROR
# why: imports a module that does not exist
import torch
import kernelarc_corpus_no_such_module


def run(hidden_states, weight, output):
    output.copy_(kernelarc_corpus_no_such_module.rmsnorm(hidden_states, weight))
