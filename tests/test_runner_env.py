"""horovodlike.runner.common.util.env, at the path Horovod's process-set tests import it from."""

import pytest

from conftest import assert_all_ranks, launch
from horovodlike.runner.common.util.env import get_env_rank_and_size

VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
             "PMI_RANK", "PMI_SIZE")


def test_rank_and_size_before_init_match_the_launchers():
    result = launch(3, "env_rank_worker.py")
    assert_all_ranks(result, 3, "env rank and size OK")


@pytest.fixture
def clean_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_each_launchers_variables(clean_env):
    assert get_env_rank_and_size() == (0, 1)
    clean_env.setenv("PMI_RANK", "3")
    clean_env.setenv("PMI_SIZE", "5")
    assert get_env_rank_and_size() == (3, 5)
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "1")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert get_env_rank_and_size() == (1, 4)  # Open MPI's before PMI's
    clean_env.setenv("HOROVOD_RANK", "2")
    clean_env.setenv("HOROVOD_SIZE", "6")
    assert get_env_rank_and_size() == (2, 6)  # the launcher's own first


def test_half_a_pair_is_an_error(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "1")
    with pytest.raises(RuntimeError, match="OMPI_COMM_WORLD_RANK is set but "
                                           "OMPI_COMM_WORLD_SIZE is not"):
        get_env_rank_and_size()
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "two")
    with pytest.raises(RuntimeError, match="must be integers"):
        get_env_rank_and_size()
