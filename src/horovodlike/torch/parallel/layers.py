"""Megatron's 1D tensor-parallel layers over a horovodlike process set.

    h = ColumnParallelLinear(d, 4 * d, process_set=tp)(x)         # each rank: 4d/N outputs
    y = RowParallelLinear(4 * d, d, process_set=tp)(torch.relu(h)) # partial sums allreduced

Weights are created whole from the global random generator and sliced, so every rank must
create the layers in the same order with the same seed (as Megatron's CPU initialisation):
the split model then starts where the dense one does. ``from_dense`` copies an existing
``nn.Linear``/``nn.Embedding`` instead. Unlike Megatron the layers return a tensor; pass
``skip_bias_add=True`` for Megatron's ``(output, bias)`` pair.
"""

import math

import torch
import torch.nn.functional as F

from horovodlike.common.process_sets import global_process_set
from horovodlike.torch.parallel import copies, mappings
from horovodlike.torch.parallel.mappings import divide


def _dense_linear_parameters(in_features, out_features, bias):
    """The weight and bias nn.Linear would draw (same generator calls, same order)."""
    weight = torch.empty(out_features, in_features)
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        b = torch.empty(out_features).uniform_(-bound, bound)
    return weight, b


def _copies_option(layer, num_copies, batch_dim, sequence_parallel):
    """Checks the multi-copy options of a linear layer: the copies split the batch, which the
    sequence-parallel collectives (along the sequence) do not handle."""
    copies.check_num_copies(num_copies, layer)
    if num_copies > 1 and sequence_parallel:
        raise ValueError(f"{layer}: num_copies={num_copies} overlaps the allreduce of the "
                         "tensor-parallel layout; it cannot be combined with "
                         "sequence_parallel=True (use num_copies=1 there)")
    if not isinstance(batch_dim, int) or isinstance(batch_dim, bool):
        raise ValueError(f"{layer}: batch_dim must be an int, got {batch_dim!r}")
    return num_copies, batch_dim


def _copies_repr(layer):
    return f", num_copies={layer.num_copies}" if layer.num_copies > 1 else ""


class ColumnParallelLinear(torch.nn.Module):
    """Y = XA + b with A split by columns (outputs): rank i holds out_features/N outputs.

    Forward: the input is copied to every rank (its gradient is allreduced in backward), or
    with ``sequence_parallel`` allgathered along the first (sequence) dimension (and its
    gradient reduce-scattered); ``sequence_dim`` says which dimension that is (Megatron's
    [sequence, batch, hidden] by default, 1 for [batch, sequence, hidden]).
    ``gather_output=True`` concatenates the outputs on every rank; otherwise each rank keeps its
    slice, ready for a RowParallelLinear. ``num_copies=k`` splits the batch (dimension
    ``batch_dim``) into k copies in backward: each copy's input-gradient allreduce runs while
    the next copy's input gradient, then the weight gradient, is computed (see copies.py).
    """

    def __init__(self, in_features, out_features, bias=True, gather_output=False,
                 process_set=global_process_set, sequence_parallel=False, skip_bias_add=False,
                 sequence_dim=0, num_copies=1, batch_dim=0):
        super().__init__()
        self.process_set, self.sequence_dim = process_set, sequence_dim
        self.num_copies, self.batch_dim = _copies_option(
            "ColumnParallelLinear", num_copies, batch_dim, sequence_parallel)
        self.world_size = mappings.group_size(process_set)
        self.in_features, self.out_features = in_features, out_features
        self.output_size_per_partition = divide(
            out_features, self.world_size, f"ColumnParallelLinear out_features")
        if gather_output and sequence_parallel:
            raise ValueError("ColumnParallelLinear: gather_output=True and sequence_parallel "
                             "cannot be combined (Megatron refuses it too)")
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.skip_bias_add = skip_bias_add
        weight, b = _dense_linear_parameters(in_features, out_features, bias)
        self.weight = torch.nn.Parameter(self._mine(weight))
        self.bias = torch.nn.Parameter(self._mine(b)) if bias else None

    def _mine(self, tensor):
        start = mappings.group_rank(self.process_set) * self.output_size_per_partition
        return tensor[start:start + self.output_size_per_partition].clone()

    @classmethod
    def from_dense(cls, linear, process_set=global_process_set, **kwargs):
        """This rank's part of an existing ``nn.Linear``."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    process_set=process_set, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(layer._mine(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(layer._mine(linear.bias))
        return layer

    def forward(self, x):
        bias = None if self.skip_bias_add else self.bias
        if self.num_copies > 1:
            copies.split_batch(x, self.num_copies, self.batch_dim, "ColumnParallelLinear")
            out = copies.ColumnLinearCopies.apply(x, self.weight, bias, self.process_set,
                                                  self.world_size, self.num_copies,
                                                  self.batch_dim)
        elif self.sequence_parallel:
            x = mappings.gather_from_sequence_parallel_region(x, self.process_set,
                                                              self.sequence_dim)
            out = F.linear(x, self.weight, bias)
        else:
            x = mappings.copy_to_tensor_model_parallel_region(x, self.process_set)
            out = F.linear(x, self.weight, bias)
        if self.gather_output:
            out = mappings.gather_from_tensor_model_parallel_region(out, self.process_set)
        return (out, self.bias) if self.skip_bias_add else out

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({self.output_size_per_partition} here), gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}" + _copies_repr(self))


class RowParallelLinear(torch.nn.Module):
    """Y = XA + b with A split by rows (inputs): rank i holds in_features/N inputs.

    ``input_is_parallel=True`` takes this rank's slice of the input's last dimension (a
    ColumnParallelLinear's output); otherwise the full input is split here. The partial
    products are allreduced (the gradient passes through), or with ``sequence_parallel``
    reduce-scattered along ``sequence_dim``. The bias, whole on every rank, is added after.
    ``num_copies=k`` splits the batch (dimension ``batch_dim``) into k copies: each copy's
    allreduce runs while the next copy's matmul computes (see copies.py).
    """

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True,
                 process_set=global_process_set, sequence_parallel=False, skip_bias_add=False,
                 sequence_dim=0, num_copies=1, batch_dim=0):
        super().__init__()
        self.num_copies, self.batch_dim = _copies_option(
            "RowParallelLinear", num_copies, batch_dim, sequence_parallel)
        self.in_features, self.out_features = in_features, out_features
        self.process_set, self.sequence_dim = process_set, sequence_dim
        self.world_size = mappings.group_size(process_set)
        self.input_size_per_partition = divide(
            in_features, self.world_size, "RowParallelLinear in_features")
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel needs input_is_parallel=True")
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.skip_bias_add = skip_bias_add
        weight, b = _dense_linear_parameters(in_features, out_features, bias)
        self.weight = torch.nn.Parameter(self._mine(weight))
        self.bias = torch.nn.Parameter(b.clone()) if bias else None

    def _mine(self, weight):
        start = mappings.group_rank(self.process_set) * self.input_size_per_partition
        return weight[:, start:start + self.input_size_per_partition].clone()

    @classmethod
    def from_dense(cls, linear, process_set=global_process_set, **kwargs):
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    process_set=process_set, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(layer._mine(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x):
        if not self.input_is_parallel:
            x = mappings.scatter_to_tensor_model_parallel_region(x, self.process_set)
        if self.num_copies > 1:
            copies.split_batch(x, self.num_copies, self.batch_dim, "RowParallelLinear")
            out = copies.RowLinearCopies.apply(x, self.weight, self.process_set, self.world_size,
                                               self.num_copies, self.batch_dim)
        elif self.sequence_parallel:
            out = mappings.reduce_scatter_to_sequence_parallel_region(
                F.linear(x, self.weight), self.process_set, self.sequence_dim)
        else:
            out = mappings.reduce_from_tensor_model_parallel_region(F.linear(x, self.weight),
                                                                    self.process_set)
        bias = self.bias
        if bias is not None and self.sequence_parallel:
            # Each rank adds the bias to its own rows only: its gradient there is partial and
            # is summed over the set so every copy of the bias gets the whole gradient.
            bias = mappings.copy_to_tensor_model_parallel_region(bias, self.process_set)
        if self.skip_bias_add:
            return out, bias
        return out + bias if bias is not None else out

    def extra_repr(self):
        return (f"in_features={self.in_features} ({self.input_size_per_partition} here), "
                f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}, "
                f"sequence_parallel={self.sequence_parallel}" + _copies_repr(self))


def _embedding_shard(num_embeddings, embedding_dim, index):
    """This rank's part (``index`` into the whole table) of a table drawn as nn.Embedding
    draws it: the whole table is drawn on every rank, so that the parts fit together."""
    weight = torch.empty(num_embeddings, embedding_dim)
    torch.nn.init.normal_(weight)
    return torch.nn.Parameter(weight[index].clone())


class VocabParallelEmbedding(torch.nn.Module):
    """An embedding table split by vocabulary: rank i holds rows [i*V/N, (i+1)*V/N). Each rank
    looks up the ids in its range (zeros elsewhere) and the partial rows are allreduced, or
    with ``sequence_parallel`` reduce-scattered along ``sequence_dim`` (Megatron's
    reduce_scatter_embeddings)."""

    def __init__(self, num_embeddings, embedding_dim, process_set=global_process_set,
                 sequence_parallel=False, sequence_dim=0):
        super().__init__()
        self.process_set = process_set
        self.sequence_parallel, self.sequence_dim = sequence_parallel, sequence_dim
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        per_rank = divide(num_embeddings, mappings.group_size(process_set),
                          "VocabParallelEmbedding num_embeddings")
        self.vocab_start_index = mappings.group_rank(process_set) * per_rank
        self.vocab_end_index = self.vocab_start_index + per_rank
        self.weight = _embedding_shard(num_embeddings, embedding_dim,
                                       (slice(self.vocab_start_index, self.vocab_end_index),))

    @classmethod
    def from_dense(cls, embedding, process_set=global_process_set, **kwargs):
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, process_set=process_set,
                    **kwargs)
        with torch.no_grad():
            layer.weight.copy_(embedding.weight[layer.vocab_start_index:layer.vocab_end_index])
        return layer

    def forward(self, ids):
        outside = (ids < self.vocab_start_index) | (ids >= self.vocab_end_index)
        local = (ids - self.vocab_start_index).masked_fill(outside, 0)
        rows = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return mappings.reduce_scatter_to_sequence_parallel_region(rows, self.process_set,
                                                                       self.sequence_dim)
        return mappings.reduce_from_tensor_model_parallel_region(rows, self.process_set)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, rows "
                f"[{self.vocab_start_index}, {self.vocab_end_index}) here")


class ColumnParallelEmbedding(torch.nn.Module):
    """An embedding table split by its embedding dimension: rank i holds columns
    [i*D/N, (i+1)*D/N) of every row and returns that slice of each looked-up vector (the ids
    are whole on every rank; nothing is sent). The output is ready for a RowParallelLinear."""

    def __init__(self, num_embeddings, embedding_dim, process_set=global_process_set):
        super().__init__()
        self.process_set = process_set
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        per_rank = divide(embedding_dim, mappings.group_size(process_set),
                          "ColumnParallelEmbedding embedding_dim")
        self.dim_start_index = mappings.group_rank(process_set) * per_rank
        self.dim_end_index = self.dim_start_index + per_rank
        self.weight = _embedding_shard(num_embeddings, embedding_dim,
                                       (slice(None), slice(self.dim_start_index,
                                                           self.dim_end_index)))

    @classmethod
    def from_dense(cls, embedding, process_set=global_process_set):
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, process_set=process_set)
        with torch.no_grad():
            layer.weight.copy_(embedding.weight[:, layer.dim_start_index:layer.dim_end_index])
        return layer

    def forward(self, ids):
        return F.embedding(ids, self.weight)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, columns "
                f"[{self.dim_start_index}, {self.dim_end_index}) here")


# The name the model-parallel design uses for it.
ParallelEmbedding = VocabParallelEmbedding
