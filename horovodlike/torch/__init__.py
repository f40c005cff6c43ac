"""horovodlike for PyTorch: the API of ``horovod.torch``.

    import horovodlike.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
"""

from horovodlike.common.basics import (init, shutdown, is_initialized, rank, size, local_rank,
                                       local_size, cross_rank, cross_size, is_homogeneous,
                                       mpi_built, gloo_built, nccl_built, ddl_built, ccl_built,
                                       cuda_built, rocm_built, mpi_enabled, gloo_enabled,
                                       mpi_threads_supported)
from horovodlike.common.exceptions import (HorovodInternalError, HostsUpdatedInterrupt,
                                           TensorMismatchError)
from horovodlike.torch.compression import Compression
from horovodlike.torch.mpi_ops import (Average, Sum, Min, Max, Product, Adasum,
                                       allreduce, allreduce_, allreduce_async, allreduce_async_,
                                       allgather, allgather_async,
                                       broadcast, broadcast_, broadcast_async, broadcast_async_,
                                       synchronize, poll, barrier)
from horovodlike.torch.functions import (broadcast_parameters, broadcast_optimizer_state,
                                         broadcast_object, allgather_object)
from horovodlike.torch.optimizer import DistributedOptimizer
