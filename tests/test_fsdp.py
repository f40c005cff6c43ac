"""fully_shard (FSDP2's API): training with SGD-momentum and Adam equals single-process training
on the global batch, with and without resharding after the forward; gradient accumulation
without sync; shard sizes and freed buffers; full and sharded state dicts; the errors; HSDP over
a 2x2 mesh and reshard_after_forward=2 on 4 ranks; bfloat16 mixed precision against float32;
CPU offloading against none."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("mode,np", [("train", 2), ("four", 4)])
def test_fully_shard(mode, np):
    result = launch(np, "fsdp_worker.py", mode, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, np, f"fsdp {mode} OK")


@pytest.mark.parametrize("mode,np", [("two", 2), ("four", 4)])
def test_fully_shard_features(mode, np):
    """Implicit prefetching, FSDP2's setters, shard_placement_fn, init_device_mesh and a
    torch.distributed DeviceMesh (tests/workers/fsdp_features_worker.py)."""
    result = launch(np, "fsdp_features_worker.py", mode,
                    env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, np, f"fsdp features {mode} OK")
