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
from horovodlike.common.basics import start_timeline, stop_timeline
from horovodlike.common.exceptions import (HorovodInternalError, HostsUpdatedInterrupt,
                                           TensorMismatchError)
from horovodlike.torch.compression import Compression
from horovodlike.common.process_sets import (ProcessSet, global_process_set, add_process_set,
                                             remove_process_set)
from horovodlike.torch.mpi_ops import (Average, Sum, Min, Max, Product, Adasum,
                                       allreduce, allreduce_, allreduce_async, allreduce_async_,
                                       grouped_allreduce, grouped_allreduce_,
                                       grouped_allreduce_async, grouped_allreduce_async_,
                                       allgather, allgather_async, grouped_allgather,
                                       grouped_allgather_async,
                                       broadcast, broadcast_, broadcast_async, broadcast_async_,
                                       alltoall, alltoall_async,
                                       reducescatter, reducescatter_async, grouped_reducescatter,
                                       grouped_reducescatter_async,
                                       synchronize, poll, barrier, join)
from horovodlike.torch.sparse_ops import sparse_allreduce_async
from horovodlike.torch.functions import (broadcast_parameters, broadcast_optimizer_state,
                                         broadcast_object, allgather_object)
from horovodlike.torch.optimizer import DistributedOptimizer
from horovodlike.torch.sync_batch_norm import SyncBatchNorm
from horovodlike.torch.process_mesh import ProcessMesh
from horovodlike.torch.zero_redundancy_optimizer import ZeroRedundancyOptimizer
from horovodlike.torch.sharded_embedding import ShardedEmbedding, ShardedEmbeddingBag
from horovodlike.torch.planner import calibrate, plan
from horovodlike.torch import elastic
from horovodlike.torch.p2p import (send, recv, isend, irecv, irecv_any, send_async, recv_async,
                                   P2POp, batch_isend_irecv, send_differentiable,
                                   recv_differentiable)
