"""fully_shard composed with a pipeline (pp x fsdp) and with tensor-parallel layers
(tp x fsdp) on a 2-D ProcessMesh of 4 ranks: training equals one process on the global batch."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("mode,marker", [("pp", "pp x fsdp OK"), ("tp", "tp x fsdp OK")])
def test_fully_shard_composes(mode, marker):
    result = launch(4, "fsdp_compose_worker.py", mode,
                    env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, 4, marker)
