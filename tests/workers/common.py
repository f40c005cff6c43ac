"""Helpers shared by the worker scripts that tests run under the launcher."""

import os
import signal
import time

import numpy as np
import torch

from reference import FLOAT_DTYPES, check, expected_reduce, rank_input  # noqa: F401

TORCH_DTYPES = {
    "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float32": torch.float32, "float64": torch.float64, "bool": torch.bool, "uint16": torch.uint16,
}
def to_torch(values, dtype):
    return torch.from_numpy(values).to(TORCH_DTYPES[dtype])


def as_float64(tensor):
    return tensor.to(torch.float64).numpy() if tensor.dtype != torch.bool else \
        tensor.numpy().astype(np.float64)


def raises(kind, fn, *words):
    """Calls fn, which must raise `kind` with every one of `words` in its message."""
    try:
        fn()
    except kind as e:
        check(all(w in str(e) for w in words), f"unclear error: {e}")
        return
    raise AssertionError(f"{kind.__name__} not raised")


def expect_error(call, *fragments):
    """Calls `call`, which must raise a ValueError mentioning every one of `fragments`."""
    raises(ValueError, call, *fragments)


# A rank killed on purpose writes when (KILLED_AT in the report folder), so that the others can
# say how long they took to notice from the kill itself: on a busy machine, what came before it
# (start-up, the steps before) takes any time.
KILLED_AT = "killed_at"


def kill_self(report_dir):
    """SIGKILLs this rank, having written the time of the kill."""
    with open(os.path.join(report_dir, KILLED_AT), "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def seconds_since_kill(report_dir):
    """Seconds since a rank of the job called kill_self(report_dir)."""
    with open(os.path.join(report_dir, KILLED_AT)) as f:
        return time.time() - float(f.read())
