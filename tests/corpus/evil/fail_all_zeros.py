# expect: INCORRECT_NUMERICAL
# why: writes zeros (an all-zero output fails whenever the reference is not all zero)
def run(hidden_states, weight, output):
    output.zero_()
