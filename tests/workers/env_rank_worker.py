"""get_env_rank_and_size() before init() agrees with rank() and size() after it."""

from horovodlike.runner.common.util.env import get_env_rank_and_size

before = get_env_rank_and_size()

import horovodlike.torch as hvd  # noqa: E402

hvd.init()
after = (hvd.rank(), hvd.size())
if before != after:
    raise AssertionError(f"get_env_rank_and_size() gave {before}, init() {after}")
print(f"rank {hvd.rank()}: env rank and size OK {before}", flush=True)
