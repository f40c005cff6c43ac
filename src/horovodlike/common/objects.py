"""Python objects between ranks, pickled with cloudpickle and moved as uint8 arrays."""

import io

import cloudpickle
import numpy as np

from horovodlike.common import basics, numpy_ops
from horovodlike.common.process_sets import global_process_set


def _to_bytes(obj):
    buffer = io.BytesIO()
    cloudpickle.dump(obj, buffer)
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's ``obj`` on every rank of the set (any object cloudpickle can
    serialize)."""
    # Not named after type(obj): non-root ranks often pass None.
    name = name or "broadcast_object"
    numpy_ops.relative_root(root_rank, process_set, f"broadcast_object '{name}'")
    if basics.rank() == root_rank:
        payload = _to_bytes(obj)
        length = np.array([payload.size], dtype=np.int64)
    else:
        length = np.zeros(1, dtype=np.int64)
    length = numpy_ops.broadcast(length, root_rank, f"{name}.length", process_set)
    if basics.rank() != root_rank:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    payload = numpy_ops.broadcast(payload, root_rank, f"{name}.payload", process_set)
    if basics.rank() == root_rank:
        return obj
    return cloudpickle.loads(payload.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj`` (of the set), in rank order."""
    name = name or "allgather_object"
    payload = _to_bytes(obj)
    # The byte counts travel with the payload: allgather reports each rank's first dimension.
    handle = numpy_ops.allgather_async(payload, f"{name}.payload", process_set)
    gathered = handle.wait()
    out, offset = [], 0
    for length in handle.extra:
        out.append(cloudpickle.loads(gathered[offset:offset + length].tobytes()))
        offset += length
    return out
