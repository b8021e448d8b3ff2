# expect: RUNTIME_ERROR
# why: raises an exception from inside the call
def run(hidden_states, weight, output):
    raise ValueError("corpus: this solution always fails")
