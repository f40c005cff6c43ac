"""horovodlike.torch.moe.MoE on 3 ranks against a single-process mixture of experts: outputs,
gradients, balance loss and dropped tokens, top-1 and top-2 each with and without dropped
tokens, uneven tokens; bad input."""

from conftest import assert_all_ranks, launch


def test_moe_matches_single_process():
    result = launch(3, "moe_worker.py")
    assert_all_ranks(result, 3, "moe OK")
