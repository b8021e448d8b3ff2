# expect: TIMEOUT
# timeout: 5
# why: sleeps forever (the GIL is released, so only an outside clock can stop it)
import time


def run(hidden_states, weight, output):
    while True:
        time.sleep(3600)
