"""ProcessMesh: layouts, process sets along each dimension (checked with allreduces of the
ranks), the innermost dimension inside a host, reuse of registered sets, and clear errors on
every rank before anything is sent."""

import sys

import torch

import horovodlike.torch as hvd
from common import check, expect_error

hvd.init()  # no HOROVOD_DYNAMIC_PROCESS_SETS: the mesh registers its sets itself
rank, size = hvd.rank(), hvd.size()
mode = sys.argv[1] if len(sys.argv) > 1 else "layouts"


def line_sum(mesh, dim):
    """The sum of the global ranks along this rank's line, through the mesh's set."""
    total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name=f"line.{dim}",
                          process_set=mesh.process_set(dim))
    return int(total.item())


if mode == "layouts":
    # Default: the last dimension innermost, ranks in row-major order.
    mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"))
    pp, dp = rank // 2, rank % 2
    check(mesh.coordinate("pp") == pp and mesh.coordinate("dp") == dp, f"{mesh.coordinate()}")
    check(mesh.process_set("dp").ranks == [2 * pp, 2 * pp + 1], f"{mesh.process_set('dp')}")
    check(mesh.process_set("pp").ranks == [dp, dp + 2], f"{mesh.process_set('pp')}")
    check(line_sum(mesh, "dp") == 4 * pp + 1, "dp set")
    check(line_sum(mesh, "pp") == 2 * dp + 2, "pp set")
    check(mesh.rank_at(pp=1 - pp) == 2 * (1 - pp) + dp, "rank_at by name")
    check(mesh.rank_at((1, 0)) == 2 and mesh.coordinate_of(3) == (1, 1), "rank_at tuple")
    check(mesh.ranks_along("pp") == [dp, dp + 2], "ranks_along")
    check(mesh.process_set("dp").rank() == dp, "set rank equals the coordinate")
    # DeviceMesh's names for the same things.
    check(mesh.get_group("dp") == mesh.process_set("dp") and
          mesh.get_group(0) == mesh.process_set("pp"), "get_group")
    check(mesh.get_local_rank(1) == dp and mesh.get_coordinate() == [pp, dp] and
          mesh.mesh_dim_names == ("pp", "dp"), "get_local_rank / get_coordinate")
    # Innermost pp: pipeline neighbours get consecutive ranks, dp strides across.
    inner_pp = hvd.ProcessMesh((2, 2), ("pp", "dp"), innermost="pp")
    check(inner_pp.coordinate() == (rank % 2, rank // 2), f"{inner_pp.coordinate()}")
    check(inner_pp.process_set("pp").ranks == [rank - rank % 2, rank - rank % 2 + 1], "pp")
    # Its dp sets are the first mesh's pp sets: registered once, reused.
    check(inner_pp.process_set("dp").process_set_id == mesh.process_set("pp").process_set_id,
          "a set with the same ranks was registered twice")
    check(line_sum(inner_pp, "pp") == 4 * (rank // 2) + 1, "inner pp set")
    # Three dimensions, one of size 1 (a one-rank set), one spanning the job.
    flat = hvd.ProcessMesh((1, size, 1), ("pp", "dp", "tp"))
    check(flat.process_set("dp") == hvd.global_process_set, "the whole job is the global set")
    check(flat.process_set("tp").ranks == [rank] and line_sum(flat, "tp") == rank, "tp")
    check(line_sum(flat, "dp") == size * (size - 1) // 2, "dp over the job")
    print(f"rank {rank}: mesh layouts OK", flush=True)

elif mode == "hosts":
    # Two simulated hosts of two ranks: whichever dimension is innermost stays on one host.
    for inner, shared in (("dp", "dp"), ("pp", "pp")):
        mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"), innermost=inner)
        check(mesh.innermost_within_host, f"{inner} innermost left its host")
        same_host = [rank - rank % 2, rank - rank % 2 + 1]
        check(mesh.process_set(shared).ranks == same_host, f"{mesh.process_set(shared)}")
        check(line_sum(mesh, shared) == sum(same_host), "sum along the host")
    wide = hvd.ProcessMesh((1, 4), ("pp", "dp"))
    check(not wide.innermost_within_host, "a dp line over two hosts reported inside one")
    print(f"rank {rank}: mesh hosts OK", flush=True)

elif mode == "errors":
    expect_error(lambda: hvd.ProcessMesh((3, 2), ("pp", "dp")), "(3, 2)", "6 ranks",
                 f"has {size}")
    expect_error(lambda: hvd.ProcessMesh((2, 2), ("pp",)), "1 names")
    expect_error(lambda: hvd.ProcessMesh((2, 2), ("dp", "dp")), "distinct")
    expect_error(lambda: hvd.ProcessMesh((2, 2), ("pp", "dp"), innermost="tp"), "'tp'")
    # Ranks that disagree: every rank raises, naming the ranks that differ.
    inner = "dp" if rank == 0 else "pp"
    expect_error(lambda: hvd.ProcessMesh((2, 2), ("pp", "dp"), innermost=inner),
                 "every rank must create the same mesh", "ranks [1, 2, 3]" if rank == 0
                 else "ranks [0]")
    mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"))
    expect_error(lambda: mesh.process_set("tp"), "no dimension 'tp'", "('pp', 'dp')")
    expect_error(lambda: mesh.rank_at(pp=2), "outside the mesh")
    expect_error(lambda: mesh.get_group(2), "mesh_dim 2 is out of range")
    check(line_sum(mesh, "dp") == 4 * (rank // 2) + 1, "the mesh works after the errors")
    print(f"rank {rank}: mesh errors OK", flush=True)
