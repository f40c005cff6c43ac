"""Small allreduces staged in shared memory before the negotiation (HOROVOD_EARLY_STAGING):
results against NumPy where the ranks stage the same tensor, different ones, or none, at 2
ranks, 3 (the negotiation through its root) and 4 (by recursive doubling), and the counter
that says the staging was used. It is used where a wait gives up the core: with more ranks
than cores (3 and 4 here), or with spinning off (HOROVOD_SHM_SPIN_US=0, for 2)."""

# Waits that do not spin, at 2 ranks on any machine.
NO_SPIN = {"HOROVOD_SHM_SPIN_US": "0"}

import json

import pytest

from conftest import assert_all_ranks, launch


def staging_counts(result):
    counts = {}
    for line in result.stdout.splitlines():
        if "STAGING " in line:
            rank = int(line.split("rank ", 1)[1].split(":", 1)[0])
            counts[rank] = json.loads(line.split("STAGING ", 1)[1])
    return counts


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_staged_allreduces_match_numpy(np_):
    result = launch(np_, "early_staging_worker.py", transport="tcp", timeout=180,
                    env=NO_SPIN if np_ == 2 else None)
    assert_all_ranks(result, np_, "STAGING")
    counts = staging_counts(result)
    # Of the 240 steady calls 150 are small enough to stage, the paired phase's single calls
    # add 40, and its pairs more where a round takes one member alone; a round the ranks enter
    # at different moments stages again in the next, so most of them should be. The counts
    # agree on every rank: the negotiation decides for all.
    staged = {rank: c["early_staged_allreduces"] for rank, c in counts.items()}
    assert len(set(staged.values())) == 1, staged
    assert staged[0] >= 100, counts


def test_staging_off_runs_the_same_calls_unstaged():
    result = launch(2, "early_staging_worker.py", transport="tcp", timeout=180,
                    env={"HOROVOD_EARLY_STAGING": "0", **NO_SPIN})
    assert_all_ranks(result, 2, "STAGING")
    counts = staging_counts(result)
    assert all(c["early_staged_allreduces"] == 0 for c in counts.values()), counts
    # Every call ran: 240 steady ones alone, and at least one collective for each of the 60
    # crossed and 40 paired rounds (two tensors ready in one round fuse: how many do depends
    # on when each rank's second call comes) and the 40 single ones after the pairs.
    assert all(c["allreduce_collectives"] >= 380 for c in counts.values()), counts


def test_a_small_cache_reuses_slots_for_other_tensors():
    # Two cache slots for eleven tensors: slots change hands between tensors all the time, and
    # a staging tag (the slot and the call) must still never match a different tensor.
    result = launch(2, "early_staging_worker.py", transport="tcp", timeout=180,
                    env={"HOROVOD_CACHE_CAPACITY": "2", **NO_SPIN})
    assert_all_ranks(result, 2, "STAGING")
