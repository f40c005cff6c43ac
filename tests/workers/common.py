"""Helpers shared by the worker scripts that tests run under the launcher."""

import numpy as np
import torch

TORCH_DTYPES = {
    "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float32": torch.float32, "float64": torch.float64, "bool": torch.bool,
}
FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}


def rank_input(dtype, count, rank, seed, op):
    """The tensor rank `rank` contributes; every rank can compute every other rank's input.

    Returned as float64 NumPy values exactly representable in `dtype`, so NumPy can compute the
    expected result independently of the runtime.
    """
    rng = np.random.default_rng([seed, rank, count, len(dtype)])
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(np.float64)
    if op == "Product":
        # Small magnitudes keep products exact in every dtype.
        values = rng.choice([-1.0, 1.0, 2.0] if dtype != "uint8" else [1.0, 2.0], count)
        return values
    if dtype in FLOAT_DTYPES:
        # Multiples of 1/8 up to 64: exact in float16 and bfloat16, and so are their sums.
        return rng.integers(-64, 64, count) / 8.0 if dtype != "bfloat16" else \
            rng.integers(-16, 16, count) / 4.0
    info = np.iinfo(np.dtype(dtype))
    low, high = max(info.min, -100), min(info.max, 100)
    return rng.integers(low, high, count).astype(np.float64)


def to_torch(values, dtype):
    return torch.from_numpy(values).to(TORCH_DTYPES[dtype])


def as_float64(tensor):
    return tensor.to(torch.float64).numpy() if tensor.dtype != torch.bool else \
        tensor.numpy().astype(np.float64)


def expected_reduce(inputs, op, dtype, size):
    """NumPy's reduction of the ranks' inputs, in the arithmetic of `dtype`."""
    stacked = np.stack(inputs)
    if dtype == "bool":
        b = stacked.astype(bool)
        return (b.any(0) if op in ("Sum", "Max") else b.all(0)).astype(np.float64)
    if op in ("Sum", "Average"):
        result = stacked.sum(0)
    elif op == "Min":
        result = stacked.min(0)
    elif op == "Max":
        result = stacked.max(0)
    else:
        result = stacked.prod(0)
    if dtype not in FLOAT_DTYPES:
        # Integer arithmetic wraps as in NumPy's fixed-width types.
        result = result.astype(np.int64).astype(np.dtype(dtype)).astype(np.float64)
    if op == "Average":
        if dtype in FLOAT_DTYPES:
            result = result / size
        else:
            result = np.trunc(result * (1.0 / size))
            result = result.astype(np.int64).astype(np.dtype(dtype)).astype(np.float64)
    return result


def check(condition, message):
    if not condition:
        raise AssertionError(message)
