"""Linear2D: a linear layer whose weight and activations are both split over an R x C grid of
ranks (2D tensor parallelism, SUMMA-style).

Rank (i, j) holds the activation block X[i, j] (rows i of the batch, inputs j) and the weight
block W[i, j] (inputs i, outputs j, W being in_features x out_features). SUMMA's broadcasts of
X[i, k] along row i and W[k, j] along column j become one allgather each:

    forward    X[i, :] = allgather over row i,  W[:, j] = allgather over column j,
               Y[i, j] = X[i, :] W[:, j]                     (no reduction needed)
    backward   dX[i, j] = reducescatter over row i    of dY[i, j] W[:, j]^T
               dW[i, j] = reducescatter over column j of X[i, :]^T dY[i, j]

The output block has the input's layout (rows i, outputs j), so Linear2D layers chain. Per
rank and per matmul this moves (C-1)/C of an activation row block and (R-1)/R of a weight
column block each way, against 1D's allreduce of the whole activation: the seed's
2bs[e(x-1) + h(y-1)]/xy against 2(P-1)bsh/P.
"""

import torch

from horovodlike.torch.parallel import mappings
from horovodlike.torch.parallel.layers import _dense_linear_parameters
from horovodlike.torch.parallel.mappings import divide


def _grid_sets(mesh, dims):
    """(row set, column set, row index i, column index j) of this rank on a 2D mesh."""
    dims = tuple(dims or mesh.dim_names)
    if len(dims) != 2 or len(mesh.dim_names) != 2 or set(dims) != set(mesh.dim_names):
        raise ValueError(f"Linear2D needs a two-dimensional ProcessMesh, got {mesh}; dims "
                         f"{dims} must name its two dimensions (rows, columns)")
    row_dim, column_dim = dims
    for dim in dims:
        line = mesh.ranks_along(dim)
        if line != sorted(line):
            raise ValueError(f"Linear2D: the ranks along {dim!r} are {line}, not ascending; "
                             "build the mesh on one host or with the default layout")
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
    """``y = x A^T + b`` on a 2D ``ProcessMesh`` of R x C ranks (q x q in the classic form).

    ``dims`` names the mesh's (row, column) dimensions (its own order by default). The input
    is this rank's block of the activation (batch rows i of R, features j of C: see
    ``split_2d``); the output is the block (rows i, outputs j). The weight block is stored as
    nn.Linear stores its weight: ``(out_features/C, in_features/R)``; the bias block
    ``out_features/C`` is repeated down each column (its gradient is summed over the column).
    """

    def __init__(self, in_features, out_features, mesh, bias=True, dims=None):
        super().__init__()
        self.row_set, self.column_set, self.i, self.j = _grid_sets(mesh, dims)
        # A column holds the R ranks of the grid's rows, a row the C ranks of its columns.
        self.rows = mappings.group_size(self.column_set)
        self.columns = mappings.group_size(self.row_set)
        self.in_features, self.out_features = in_features, out_features
        # The input's features are split over a row, the weight's inputs over a column.
        divide(in_features, self.columns, "Linear2D in_features")
        self.in_block = divide(in_features, self.rows, "Linear2D in_features")
        self.out_block = divide(out_features, self.columns, "Linear2D out_features")
        weight, b = _dense_linear_parameters(in_features, out_features, bias)
        self.weight = torch.nn.Parameter(self._weight_block(weight))
        self.bias = torch.nn.Parameter(self._bias_block(b)) if bias else None

    def _weight_block(self, weight):
        return weight[self.j * self.out_block:(self.j + 1) * self.out_block,
                      self.i * self.in_block:(self.i + 1) * self.in_block].clone()

    def _bias_block(self, bias):
        return bias[self.j * self.out_block:(self.j + 1) * self.out_block].clone()

    @classmethod
    def from_dense(cls, linear, mesh, dims=None):
        layer = cls(linear.in_features, linear.out_features, mesh,
                    bias=linear.bias is not None, dims=dims)
        with torch.no_grad():
            layer.weight.copy_(layer._weight_block(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(layer._bias_block(linear.bias))
        return layer

    def forward(self, x):
        if x.dim() != 2 or x.shape[1] * self.columns != self.in_features:
            raise ValueError(f"Linear2D: expected this rank's (rows, {self.in_features}/"
                             f"{self.columns}) block of the input, got {tuple(x.shape)}")
        y = _Summa.apply(x, self.weight, self.row_set, self.column_set)
        if self.bias is not None:
            y = y + mappings.copy_to_tensor_model_parallel_region(self.bias, self.column_set)
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"grid {self.rows}x{self.columns}, block ({self.i}, {self.j})")


def split_2d(x, mesh, dims=None):
    """This rank's block of a 2D activation every rank holds whole: rows i of R, columns j of
    C (differentiable: the gradient blocks are gathered back)."""
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
