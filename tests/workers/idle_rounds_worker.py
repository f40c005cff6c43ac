"""An idle job: every rank sleeps while its loop runs a round each cycle. No rank has work
in any set, so no round rings a peer's round bell (core/round_bells.h); a bell would only
wake the peer's loop for another round with nothing in it. Prints the rounds each rank's loop
ran meanwhile and the bells it rang."""

import time

import horovodlike.torch as hvd
from horovodlike import _core

hvd.init()
before = _core.stats()
time.sleep(1.0)
after = _core.stats()
rounds = after["loop_rounds"] - before["loop_rounds"]
bells = after["shm_round_bells"] - before["shm_round_bells"]
print(f"rank {hvd.rank()}: IDLE rounds {rounds} bells {bells}", flush=True)
hvd.shutdown()
