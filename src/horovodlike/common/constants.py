"""The core's numbering of reduce ops, collectives, dtypes and statuses, taken from the
extension (its single source): the framework layers import these names from here."""

from horovodlike import _core

# Reduce ops, as Horovod names them.
Average = _core.REDUCE_OPS["Average"]
Sum = _core.REDUCE_OPS["Sum"]
Min = _core.REDUCE_OPS["Min"]
Max = _core.REDUCE_OPS["Max"]
Product = _core.REDUCE_OPS["Product"]
# Adaptive summation (allreduce of floating tensors over a power-of-two number of ranks).
Adasum = _core.REDUCE_OPS["Adasum"]
REDUCE_OP_NAMES = {code: name for name, code in _core.REDUCE_OPS.items()}

# Collectives.
ALLREDUCE = _core.OPS["allreduce"]
ALLGATHER = _core.OPS["allgather"]
BROADCAST = _core.OPS["broadcast"]
BARRIER = _core.OPS["barrier"]
ALLTOALL = _core.OPS["alltoall"]
REDUCESCATTER = _core.OPS["reducescatter"]
JOIN = _core.OPS["join"]
ADD_PROCESS_SET = _core.OPS["add_process_set"]
REMOVE_PROCESS_SET = _core.OPS["remove_process_set"]
OP_NAMES = {code: name for name, code in _core.OPS.items()}

# Dtypes by their NumPy / PyTorch / TensorFlow name ("float32", "bool", ...).
DTYPES = dict(_core.DTYPES)
FLOATING_DTYPES = tuple(_core.FLOATING_DTYPES)

# The longest name of a collective, in UTF-8 bytes: the most a message carries per string.
MAX_NAME_BYTES = _core.MAX_NAME_BYTES

STATUS_OK = _core.STATUS_OK
STATUS_INVALID_ARGUMENT = _core.STATUS_INVALID_ARGUMENT
STATUS_MISMATCH = _core.STATUS_MISMATCH
STATUS_INTERNAL = _core.STATUS_INTERNAL
STATUS_SHUTDOWN = _core.STATUS_SHUTDOWN
