"""Tensor-parallel layers for PyTorch: Megatron's 1D layers, 2D and 3D linear layers, and
parallelize_module, which splits a model written for one device as a plan says.

    from horovodlike.torch.parallel import ColumnParallelLinear, RowParallelLinear
    from horovodlike.torch.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
"""

from horovodlike.torch.parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                               VocabParallelEmbedding, ParallelEmbedding,
                                               ColumnParallelEmbedding)
from horovodlike.torch.parallel.mappings import (
    copy_to_tensor_model_parallel_region, reduce_from_tensor_model_parallel_region,
    scatter_to_tensor_model_parallel_region, gather_from_tensor_model_parallel_region,
    gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region)
from horovodlike.torch.parallel.linear_2d import Linear2D, split_2d, gather_2d
from horovodlike.torch.parallel.linear_3d import Linear3D, split_3d, gather_3d
from horovodlike.torch.parallel.layouts import Replicate, Shard
from horovodlike.torch.parallel.styles import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               PrepareModuleInput, PrepareModuleOutput,
                                               ParallelStyle)
from horovodlike.torch.parallel.parallelize import parallelize_module
from horovodlike.torch.parallel.copies import MultiCopy
