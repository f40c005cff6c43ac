"""Linear2D: a linear layer whose weight and activations are both split over an R x C grid of
ranks (2D tensor parallelism). Rank (i, j) (i along the mesh's first named dimension, j along
the second) holds the weight block W[i, j]: inputs i of R, outputs j of C, W being
in_features x out_features. Two ways to multiply:

``algorithm="allgather_reducescatter"`` (the default; the seed document's 2D scheme, weights
stay put). The input block is (batch part j, features i):

    forward    X[:, i] = allgather over the line of j   (batch)
               Y[i, j] = reducescatter over the line of i (batch) of X[:, i] W[i, j]
    backward   the reverse: allgather dY, reducescatter dX; dW[i, j] needs no communication

The output block is (batch part i, outputs j): the input layout of a Linear2D with the two
dimensions swapped, so a pair chains as ``dims=("x", "y")`` then ``dims=("y", "x")``. A pair's
forward pass sends 2bs[e(x-1) + h(y-1)]/xy elements per rank (the seed's formula) and its
backward pass as much, against 2(P-1)bsh/P each way for 1D.

``algorithm="summa"`` (SUMMA: activations and weights move, no reduction forward). The input
block is (batch part i, features j), and so is the output (outputs j):

    forward    X[i, :] = allgather over row i,  W[:, j] = allgather over column j,
               Y[i, j] = X[i, :] W[:, j]
    backward   dX[i, j] = reducescatter over row i    of dY[i, j] W[:, j]^T
               dW[i, j] = reducescatter over column j of X[i, :]^T dY[i, j]

It moves (q-1)/q^2 of the weight per matmul, so it pays when the batch is large against the
weight.
"""

import torch

from horovodlike.torch.parallel import mappings
from horovodlike.torch.parallel.layers import _dense_linear_parameters
from horovodlike.torch.parallel.mappings import divide


def _check_ascending(mesh, dims, layer):
    """Allgather and reducescatter order a set's pieces by global rank: the blocks are only
    where the layer expects them when every line of the mesh is in ascending rank order."""
    for dim in dims:
        line = mesh.ranks_along(dim)
        if line != sorted(line):
            raise ValueError(f"{layer}: the ranks along {dim!r} are {line}, not ascending; "
                             "build the mesh on one host or with the default layout")


def _grid_sets(mesh, dims):
    """(row set, column set, row index i, column index j) of this rank on a 2D mesh."""
    dims = tuple(dims or mesh.dim_names)
    if len(dims) != 2 or len(mesh.dim_names) != 2 or set(dims) != set(mesh.dim_names):
        raise ValueError(f"Linear2D needs a two-dimensional ProcessMesh, got {mesh}; dims "
                         f"{dims} must name its two dimensions (rows, columns)")
    row_dim, column_dim = dims
    _check_ascending(mesh, dims, "Linear2D")
    # Row i: the ranks that share i and differ in the column index.
    return (mesh.process_set(column_dim), mesh.process_set(row_dim),
            mesh.coordinate(row_dim), mesh.coordinate(column_dim))


class _Summa(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_block, weight_block, row_set, column_set):
        x_row = mappings._gather_last(x_block, row_set)                  # (b/R, in)
        w_column = mappings._gather_first(weight_block.t().contiguous(), column_set)  # (in, out/C)
        ctx.save_for_backward(x_row, w_column)
        ctx.sets = row_set, column_set
        return x_row @ w_column

    @staticmethod
    def backward(ctx, grad):
        x_row, w_column = ctx.saved_tensors
        row_set, column_set = ctx.sets
        grad_x = mappings._reduce_scatter_first((grad @ w_column.t()).t().contiguous(),
                                                row_set).t()
        grad_w = mappings._reduce_scatter_first(x_row.t() @ grad, column_set).t()
        return grad_x.contiguous(), grad_w.contiguous(), None, None


class Linear2D(torch.nn.Module):
    """``y = x A^T + b`` on a 2D ``ProcessMesh`` of R x C ranks (q x q in the classic form);
    ``dims`` names the mesh's (R, C) dimensions (its own order by default). See the module for
    the input and output blocks of each ``algorithm``. The weight block is stored as nn.Linear
    stores its weight, ``(out_features/C, in_features/R)``; the bias block (out_features/C) is
    repeated over R ranks and its gradient summed over them.
    """

    ALGORITHMS = ("allgather_reducescatter", "summa")

    def __init__(self, in_features, out_features, mesh, bias=True, dims=None,
                 algorithm="allgather_reducescatter"):
        super().__init__()
        if algorithm not in self.ALGORITHMS:
            raise ValueError(f"Linear2D: algorithm {algorithm!r} is not one of "
                             f"{self.ALGORITHMS}")
        self.algorithm = algorithm
        # row_set: the ranks sharing i (they differ in j); column_set: those sharing j.
        self.row_set, self.column_set, self.i, self.j = _grid_sets(mesh, dims)
        self.rows = mappings.group_size(self.column_set)
        self.columns = mappings.group_size(self.row_set)
        self.in_features, self.out_features = in_features, out_features
        self.in_block = divide(in_features, self.rows, "Linear2D in_features")
        self.out_block = divide(out_features, self.columns, "Linear2D out_features")
        # The input's feature block: i of R (allgather_reducescatter) or j of C (summa).
        self.input_features = self.in_block if algorithm != "summa" else divide(
            in_features, self.columns, "Linear2D in_features")
        weight, b = _dense_linear_parameters(in_features, out_features, bias)
        self.weight = torch.nn.Parameter(self._weight_block(weight))
        self.bias = torch.nn.Parameter(self._bias_block(b)) if bias else None

    def _weight_block(self, weight):
        return weight[self.j * self.out_block:(self.j + 1) * self.out_block,
                      self.i * self.in_block:(self.i + 1) * self.in_block].clone()

    def _bias_block(self, bias):
        return bias[self.j * self.out_block:(self.j + 1) * self.out_block].clone()

    @classmethod
    def from_dense(cls, linear, mesh, dims=None, algorithm="allgather_reducescatter"):
        layer = cls(linear.in_features, linear.out_features, mesh,
                    bias=linear.bias is not None, dims=dims, algorithm=algorithm)
        with torch.no_grad():
            layer.weight.copy_(layer._weight_block(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(layer._bias_block(linear.bias))
        return layer

    def forward(self, x):
        if x.dim() != 2 or x.shape[1] != self.input_features:
            raise ValueError(f"Linear2D: expected this rank's (batch part, "
                             f"{self.input_features}) block of the input, got "
                             f"{tuple(x.shape)}")
        if self.algorithm == "summa":
            y = _Summa.apply(x, self.weight, self.row_set, self.column_set)
        else:
            divide(x.shape[0] * self.columns, self.rows, "Linear2D's gathered batch")
            whole_batch = mappings.gather_from_sequence_parallel_region(x, self.row_set)
            y = mappings.reduce_scatter_to_sequence_parallel_region(
                whole_batch @ self.weight.t(), self.column_set)
        if self.bias is not None:
            y = y + mappings.copy_to_tensor_model_parallel_region(self.bias, self.column_set)
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"grid {self.rows}x{self.columns}, block ({self.i}, {self.j}), "
                f"algorithm={self.algorithm}")


def split_2d(x, mesh, dims=None):
    """This rank's block of a 2D activation every rank holds whole: batch part along dims[0],
    features along dims[1] (differentiable: the gradient blocks are gathered back). For the
    first layer of an allgather_reducescatter pair on dims (x, y), split with dims (y, x)."""
    row_set, column_set, _, _ = _grid_sets(mesh, dims)
    x = mappings.scatter_to_sequence_parallel_region(x, column_set)      # rows i of R
    return mappings.scatter_to_tensor_model_parallel_region(x, row_set)  # columns j of C


def gather_2d(block, mesh, dims=None):
    """The whole activation from every rank's block (differentiable: the gradient is split)."""
    row_set, column_set, _, _ = _grid_sets(mesh, dims)
    x = mappings.gather_from_tensor_model_parallel_region(block, row_set)
    return _GatherRows.apply(x, column_set)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return mappings._gather_first(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return mappings._split_first(grad, ctx.process_set), None
