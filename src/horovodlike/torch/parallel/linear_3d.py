"""Linear3D: a linear layer whose weight and activations are both split over the three
dimensions of an x * y * z ``ProcessMesh`` (3D tensor parallelism). It takes the 2D scheme
(allgather the activation, reduce-scatter the partial products) one step further: the weight
is split along z as well, and allgathered along z before the multiply, so part of the
activation traffic becomes weight traffic. Only allgather and reducescatter are used.

Rank (i, j, k) (its indices along dims x, y, z) holds, with the activation (bs, h) and the
weight (h, e) as the formulas write them:

    input block   batch part k*y + j of z*y,  features i of x
    weight block  inputs i*z + k of x*z,      outputs j of y      (stored as nn.Linear does)
    bias block    outputs j of y (repeated over the x*z ranks sharing j)

    forward    X[k, i]  = allgather over y of the input blocks          (bs/z, h/x)
               W[i, j]  = allgather over z of the weight blocks         (h/x, e/y)
               Y        = reducescatter over x of X[k, i] W[i, j]       (bs/(z*x), e/y)
    backward   the reverse: allgather dY over x, reducescatter dX over y and dW over z;
               the bias gradient is summed over x and z (two allreduces of e/y)

The output block (batch part k*x + i of z*x, outputs j) is the input block of a Linear3D with
dims x and y swapped, so a pair chains as ``dims=("x", "y", "z")`` then ``("y", "x", "z")``.
The pair's forward pass sends 2[bse(x-1) + bsh(y-1) + he(z-1)]/xyz elements per rank (the seed
document's formula) and its backward pass as much, against 2bs[e(x-1) + h(y-1)]/xy for 2D.
"""

import torch

from horovodlike.torch.parallel import mappings
from horovodlike.torch.parallel.layers import _dense_linear_parameters
from horovodlike.torch.parallel.linear_2d import _GatherRows, _check_ascending
from horovodlike.torch.parallel.mappings import divide


class _Cube:
    """This rank's place on a 3D mesh: one process set and one index per role (x, y, z)."""

    def __init__(self, mesh, dims):
        dims = tuple(dims or mesh.dim_names)
        if len(mesh.dim_names) != 3 or len(dims) != 3 or set(dims) != set(mesh.dim_names):
            raise ValueError(f"Linear3D needs a three-dimensional ProcessMesh, got {mesh}; "
                             f"dims {dims} must name its three dimensions (x, y, z), e.g. "
                             "hvd.ProcessMesh((2, 2, 2), ('x', 'y', 'z'))")
        _check_ascending(mesh, dims, "Linear3D")
        self.dims = dims
        self.sets = tuple(mesh.process_set(d) for d in dims)
        self.index = tuple(mesh.coordinate(d) for d in dims)
        self.size = tuple(mesh.size(d) for d in dims)


class Linear3D(torch.nn.Module):
    """``y = x A^T + b`` on a 3D ``ProcessMesh``; ``dims`` names the mesh's dimensions in the
    roles (x, y, z) (its own order by default). See the module for the blocks each rank holds
    and the collectives. In and out features must divide by x * z and y; the batch by y * z
    (input) and x * z (output)."""

    def __init__(self, in_features, out_features, mesh, bias=True, dims=None):
        super().__init__()
        self.cube = _Cube(mesh, dims)
        x, y, z = self.cube.size
        self.in_features, self.out_features = in_features, out_features
        self.input_features = divide(in_features, x, "Linear3D in_features (split over x)")
        self.in_block = divide(in_features, x * z, "Linear3D in_features (split over x*z)")
        self.out_block = divide(out_features, y, "Linear3D out_features (split over y)")
        weight, b = _dense_linear_parameters(in_features, out_features, bias)
        self.weight = torch.nn.Parameter(self._weight_block(weight))
        self.bias = torch.nn.Parameter(self._bias_block(b)) if bias else None

    def _weight_block(self, weight):
        i, j, k = self.cube.index
        z = self.cube.size[2]
        start = (i * z + k) * self.in_block
        return weight[j * self.out_block:(j + 1) * self.out_block,
                      start:start + self.in_block].clone()

    def _bias_block(self, bias):
        j = self.cube.index[1]
        return bias[j * self.out_block:(j + 1) * self.out_block].clone()

    @classmethod
    def from_dense(cls, linear, mesh, dims=None):
        """This rank's blocks of an existing ``nn.Linear`` (every rank passes the same one)."""
        layer = cls(linear.in_features, linear.out_features, mesh,
                    bias=linear.bias is not None, dims=dims)
        with torch.no_grad():
            layer.weight.copy_(layer._weight_block(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(layer._bias_block(linear.bias))
        return layer

    def to_dense(self):
        """The whole layer as an ``nn.Linear`` on every rank (collective over the mesh; not
        differentiable): to check or save what the blocks hold."""
        x_set, y_set, z_set = self.cube.sets
        with torch.no_grad():
            weight = mappings._gather_last(self.weight.detach(), z_set)    # inputs i of x
            weight = mappings._gather_last(weight, x_set)                  # all inputs
            weight = mappings._gather_first(weight, y_set)                 # all outputs
            dense = torch.nn.Linear(self.in_features, self.out_features,
                                    bias=self.bias is not None)
            dense.weight.copy_(weight)
            if self.bias is not None:
                dense.bias.copy_(mappings._gather_first(self.bias.detach(), y_set))
        return dense

    def forward(self, inputs):
        x_size, y_size, z_size = self.cube.size
        if inputs.dim() != 2 or inputs.shape[1] != self.input_features:
            raise ValueError(f"Linear3D: expected this rank's (batch part, "
                             f"{self.input_features}) block of the input, got "
                             f"{tuple(inputs.shape)}")
        divide(inputs.shape[0] * y_size, x_size,
               "Linear3D's batch gathered over y (split again over x)")
        x_set, y_set, z_set = self.cube.sets
        rows = mappings.gather_from_sequence_parallel_region(inputs, y_set)        # (bs/z, h/x)
        weight = mappings.gather_from_sequence_parallel_region(self.weight, z_set, dim=1)
        y = mappings.reduce_scatter_to_sequence_parallel_region(rows @ weight.t(), x_set)
        if self.bias is not None:
            bias = mappings.copy_to_tensor_model_parallel_region(self.bias, x_set)
            y = y + mappings.copy_to_tensor_model_parallel_region(bias, z_set)
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"cube {'x'.join(map(str, self.cube.size))} over dims {self.cube.dims}, "
                f"block {self.cube.index}")


def split_3d(tensor, mesh, dims=None):
    """This rank's input block for a Linear3D on ``dims``, from an activation every rank holds
    whole (differentiable: the gradient blocks are gathered back)."""
    x_set, y_set, z_set = _Cube(mesh, dims).sets
    tensor = mappings.scatter_to_sequence_parallel_region(tensor, z_set)    # batch k of z
    tensor = mappings.scatter_to_sequence_parallel_region(tensor, y_set)    # then j of y
    return mappings.scatter_to_tensor_model_parallel_region(tensor, x_set)  # features i of x


def gather_3d(block, mesh, dims=None):
    """The whole output of a Linear3D on ``dims`` from every rank's block (differentiable:
    the gradient is split)."""
    x_set, y_set, z_set = _Cube(mesh, dims).sets
    tensor = mappings.gather_from_tensor_model_parallel_region(block, y_set)   # outputs
    tensor = _GatherRows.apply(tensor, x_set)       # batch parts k*x .. k*x + x-1
    return _GatherRows.apply(tensor, z_set)         # all batch parts
