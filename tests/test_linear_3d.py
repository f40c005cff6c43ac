"""horovodlike.torch.parallel.Linear3D: a layer pair split over x*y*z meshes against dense
layers (forward, input, weight and bias gradients), on 2x2x2 and on meshes with a dimension
of one, and the bad inputs refused before anything is sent."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np", [4, 8])
def test_linear_3d(np):
    result = launch(np, "linear_3d_worker.py")
    assert_all_ranks(result, np, "linear 3d OK")
