"""A process's rank and job size from its environment, before init(), at the path Horovod's
horovod.runner.common.util.env has them (its process-set tests read the size this way to build
their ProcessSets before calling init)."""

import os

# Who started the process decides which pair is set: horovodlikerun (and horovodrun) set
# HOROVOD_*, Open MPI's mpirun OMPI_COMM_WORLD_*, MPICH and Intel MPI PMI_*.
_RANK_AND_SIZE_VARIABLES = (("HOROVOD_RANK", "HOROVOD_SIZE"),
                            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                            ("PMI_RANK", "PMI_SIZE"))


def get_env_rank_and_size():
    """(rank, size) from the first launcher's variables found; (0, 1) for a process started
    alone. A rank without a size (or the reverse) is an error: the launcher's environment is
    incomplete, and guessing would give this process the wrong part of the data."""
    for rank_var, size_var in _RANK_AND_SIZE_VARIABLES:
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            missing, present = (rank_var, size_var) if rank is None else (size_var, rank_var)
            raise RuntimeError(f"cannot tell this process's rank and job size: {present} is set "
                               f"but {missing} is not")
        try:
            return int(rank), int(size)
        except ValueError:
            raise RuntimeError(f"cannot tell this process's rank and job size: {rank_var}="
                               f"{rank!r} and {size_var}={size!r} must be integers") from None
    return 0, 1
