"""horovodlike.torch.parallel: Column/Row/VocabParallel layers (plain and sequence parallel)
against dense layers forward and backward, and a transformer block with tp x dp training
against dense training on the global batch."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("mode,np", [("layers", 2), ("block", 4), ("2d", 4)])
def test_tensor_parallel(mode, np):
    result = launch(np, "tensor_parallel_worker.py", mode)
    assert_all_ranks(result, np, f"tensor parallel {mode} OK")
