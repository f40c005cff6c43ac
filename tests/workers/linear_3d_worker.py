"""Linear3D against dense nn.Linear layers, forward and backward: a pair up -> gelu -> down
on x*y*z meshes of the job's ranks, every block and gradient compared with the slice of the
dense result that this rank should hold (slices computed here, from the mesh coordinates).
Then the bad inputs, each refused before anything is sent (the job goes on afterwards)."""

import math

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.parallel import Linear3D, gather_3d, split_3d
from common import check, expect_error

hvd.init()
rank, size = hvd.rank(), hvd.size()
H, E = 8, 12


def close(got, expected, what):
    check(got.shape == expected.shape, f"{what}: shape {tuple(got.shape)}, expected "
                                       f"{tuple(expected.shape)}")
    check(torch.allclose(got, expected, rtol=1e-5, atol=1e-6),
          f"{what}: differs by {(got - expected).abs().max().item():.3g}")


def part(t, index, parts, dim=0):
    n = t.shape[dim] // parts
    return t.narrow(dim, index * n, n)


def weight_block(grad, mesh, dims):
    """Rank (i, j, k)'s block of a dense (out, in) weight: outputs j of y, inputs i*z+k."""
    (i, j, k), (x, y, z) = ([f(d) for d in dims] for f in (mesh.coordinate, mesh.size))
    return part(part(grad, j, y), i * z + k, x * z, dim=1)


def check_pair(shape, names, dims, seed):
    mesh = hvd.ProcessMesh(shape, names)
    second_dims = (dims[1], dims[0], dims[2])
    (i, j, k), (x, y, z) = ([f(d) for d in dims] for f in (mesh.coordinate, mesh.size))
    torch.manual_seed(seed)
    up, down = torch.nn.Linear(H, E), torch.nn.Linear(E, H)
    first = Linear3D.from_dense(up, mesh, dims=dims)
    second = Linear3D.from_dense(down, mesh, dims=second_dims)
    batch = 2 * x * y * z
    x_whole = torch.randn(batch, H)
    r = torch.randn(batch, H)
    inputs, x_ref = x_whole.clone().requires_grad_(), x_whole.clone().requires_grad_()
    block = split_3d(inputs, mesh, dims=dims)
    # Input block: batch part k*y + j of z*y, features i of x.
    close(block.detach(), part(part(x_whole, k * y + j, z * y), i, x, dim=1), f"{shape} input")
    hidden = first(block)
    out = gather_3d(second(F.gelu(hidden)), mesh, dims=second_dims)
    hidden_ref = up(x_ref)
    out_ref = down(F.gelu(hidden_ref))
    # Output block of the first layer: batch part k*x + i of z*x, outputs j of y.
    close(hidden.detach(), part(part(hidden_ref.detach(), k * x + i, z * x), j, y, dim=1),
          f"{shape} first output block")
    (out * r).sum().backward()
    (out_ref * r).sum().backward()
    close(out.detach(), out_ref.detach(), f"{shape} forward")
    close(inputs.grad, x_ref.grad, f"{shape} input gradient")
    close(first.weight.grad, weight_block(up.weight.grad, mesh, dims), f"{shape} up weight grad")
    close(second.weight.grad, weight_block(down.weight.grad, mesh, second_dims),
          f"{shape} down weight gradient")
    close(first.bias.grad, part(up.bias.grad, j, y), f"{shape} up bias gradient")
    close(second.bias.grad, part(down.bias.grad, i, x), f"{shape} down bias gradient")
    dense = first.to_dense()
    close(dense.weight.detach(), up.weight.detach(), f"{shape} to_dense weight")
    close(dense.bias.detach(), up.bias.detach(), f"{shape} to_dense bias")
    return mesh


def bad_inputs(mesh):
    x, y, z = (mesh.size(d) for d in mesh.dim_names)
    expect_error(lambda: Linear3D(H, E, hvd.ProcessMesh((size,), ("tp",))), "three-dimensional")
    expect_error(lambda: Linear3D(H, E, mesh, dims=("a", "b", "nope")), "three-dimensional",
                 "dims")
    expect_error(lambda: hvd.ProcessMesh((2, 2, 3), ("a", "b", "c")),
                 f"holds 12 ranks but the job has {size}")
    expect_error(lambda: Linear3D(x * z * 3 + 1, E, mesh), "in_features",
                 f"{x * z * 3 + 1} is not divisible")
    if y > 1:
        expect_error(lambda: Linear3D(H, y * 3 + 1, mesh), "out_features (split over y)")
    layer = Linear3D(H, E, mesh)
    expect_error(lambda: layer(torch.randn(2, H)), "block of the input")
    if x > y:   # the gathered batch (rows * y) must split over x
        expect_error(lambda: layer(torch.randn(1, H // x)), "split again over x")


if size == 8:
    mesh = check_pair((2, 2, 2), ("a", "b", "c"), ("a", "b", "c"), seed=30)
    bad_inputs(mesh)
    # dims other than the mesh's own order: x is the mesh's last dimension.
    check_pair((2, 2, 2), ("a", "b", "c"), ("c", "a", "b"), seed=31)
    torch.manual_seed(32)
    built = Linear3D(H, E, mesh)
    torch.manual_seed(32)
    close(built.weight.detach(), weight_block(torch.nn.Linear(H, E).weight.detach(), mesh,
                                              mesh.dim_names), "initialisation")
else:
    check(size == 4, f"run on 4 or 8 ranks, not {size}")
    check_pair((1, 2, 2), ("a", "b", "c"), ("a", "b", "c"), seed=33)
    mesh = check_pair((2, 1, 2), ("a", "b", "c"), ("a", "b", "c"), seed=34)
    bad_inputs(mesh)
check(math.prod(mesh.shape) == size, "mesh covers the job")
hvd.barrier()
print(f"rank {rank}: linear 3d OK", flush=True)
