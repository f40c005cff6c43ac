"""Tensor-parallel layers for PyTorch: Megatron's 1D layers and a 2D (SUMMA) linear layer.

    from horovodlike.torch.parallel import ColumnParallelLinear, RowParallelLinear
"""

from horovodlike.torch.parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                               VocabParallelEmbedding, ParallelEmbedding)
from horovodlike.torch.parallel.mappings import (
    copy_to_tensor_model_parallel_region, reduce_from_tensor_model_parallel_region,
    scatter_to_tensor_model_parallel_region, gather_from_tensor_model_parallel_region,
    gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region)
from horovodlike.torch.parallel.linear_2d import Linear2D, split_2d, gather_2d
