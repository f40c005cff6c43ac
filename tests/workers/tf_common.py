"""Helpers shared by the TensorFlow and Keras worker scripts (NumPy only: every expected value is
computed here, independently of horovodlike)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

DTYPES = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "bool"]
from reference import FLOAT_DTYPES, check, expected_reduce, rank_input  # noqa: E402,F401
OPS = ["Sum", "Average", "Min", "Max", "Product"]


def expect(exception, function, *fragments):
    """`function()` raises `exception` whose message holds every fragment; returns the message."""
    try:
        function()
    except exception as e:
        message = str(e)
        for fragment in fragments:
            check(fragment in message, f"{exception.__name__} message lacks {fragment!r}: "
                                       f"{message}")
        return message
    raise AssertionError(f"expected {exception.__name__} ({fragments})")
