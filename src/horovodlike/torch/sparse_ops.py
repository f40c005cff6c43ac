"""Allreduce of sparse COO tensors, as Horovod does it: every rank's indices and values are
allgathered, and the gathered entries summed (duplicates add up when coalesced)."""

import torch

from horovodlike.common.process_sets import global_process_set, set_ranks
from horovodlike.torch.mpi_ops import Average, Sum, _auto_name, allgather_async, synchronize


class _SparseHandle:
    """The two allgathers of one sparse allreduce. ``synchronize(handle)`` and, as in Horovod,
    calling ``handle()`` both return the reduced sparse tensor."""

    def __init__(self, indices_handle, values_handle, size, op, set_size):
        self.parts = (indices_handle, values_handle)
        self.size, self.op, self.set_size = size, op, set_size

    def combine(self, indices, values):
        summed = torch.sparse_coo_tensor(indices.t(), values, self.size,
                                         check_invariants=True).coalesce()
        return summed / self.set_size if self.op == Average else summed

    def __call__(self):
        return synchronize(self)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts the reduction of a sparse COO tensor (only hvd.Sum and hvd.Average);
    synchronize(handle) or handle() returns the coalesced sparse result."""
    name = name or _auto_name("sparse_allreduce", process_set)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError(f"sparse_allreduce '{name}': expected a sparse COO tensor")
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce '{name}': only hvd.Average and hvd.Sum are defined")
    tensor = tensor.coalesce()
    indices = allgather_async(tensor.indices().t().contiguous(), f"{name}.indices", process_set)
    values = allgather_async(tensor.values().contiguous(), f"{name}.values", process_set)
    return _SparseHandle(indices, values, tensor.size(), op, len(set_ranks(process_set)))
