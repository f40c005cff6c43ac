"""Reference values for the worker scripts, computed with NumPy alone (no framework, no
horovodlike): each rank's inputs, which every rank can compute for every other rank, and the
reductions they should give."""

import numpy as np

FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}


def rank_input(dtype, count, rank, seed, op="Sum"):
    """The values rank `rank` contributes, as float64 exactly representable in `dtype` (and so are
    their sums and products), so that NumPy computes the expected results exactly."""
    rng = np.random.default_rng([seed, rank, count, len(dtype)])
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(np.float64)
    if op == "Product":
        return rng.choice([-1.0, 1.0, 2.0] if not dtype.startswith("uint") else [1.0, 2.0],
                          count)
    if dtype in FLOAT_DTYPES:
        return rng.integers(-64, 64, count) / 8.0 if dtype != "bfloat16" else \
            rng.integers(-16, 16, count) / 4.0
    info = np.iinfo(np.dtype(dtype))
    return rng.integers(max(info.min, -100), min(info.max, 100), count).astype(np.float64)


def expected_reduce(inputs, op, dtype, size):
    """NumPy's reduction of the ranks' inputs, in the arithmetic of `dtype`."""
    stacked = np.stack(inputs)
    if dtype == "bool":
        b = stacked.astype(bool)
        return (b.any(0) if op in ("Sum", "Max") else b.all(0)).astype(np.float64)
    result = {"Sum": stacked.sum, "Average": stacked.sum, "Min": stacked.min,
              "Max": stacked.max, "Product": stacked.prod}[op](0)
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


# Adasum (Maleki et al.): the pair rule and Horovod's recursive pairing over ranks.
def combine(a, b, dtype):
    """The pair rule in float64, rounded to the tensor's dtype as the buffer holds it."""
    dot, na, nb = a @ b, a @ a, b @ b
    ca = 1 - dot / (2 * na) if na > 0 else 1.0
    cb = 1 - dot / (2 * nb) if nb > 0 else 1.0
    return (ca * a + cb * b).astype(dtype).astype(np.float64)


def expected_adasum(vectors, dtype):
    """Recursive pairing: at distance d, ranks r and r ^ d combine, the lower one's as `a`."""
    current = [v.astype(dtype).astype(np.float64) for v in vectors]
    distance = 1
    while distance < len(current):
        current = [combine(current[min(r, r ^ distance)], current[max(r, r ^ distance)], dtype)
                   for r in range(len(current))]
        distance *= 2
    return current[0]
