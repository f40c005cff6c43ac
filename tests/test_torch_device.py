"""horovodlike.torch end to end on a device kind (tests/workers/torch_device_worker.py): on CPU
tensors everywhere, and on CUDA tensors where PyTorch sees a GPU (one rank per GPU over NCCL,
and more ranks than GPUs, staged through host memory)."""

import pytest
import torch

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np_", [2, 3])
def test_every_feature_on_cpu_tensors(np_):
    result = launch(np_, "torch_device_worker.py", "cpu")
    assert_all_ranks(result, np_, "torch cpu ok")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="PyTorch sees no GPU here (tests/test_gpu.py covers the "
                                       "core's GPU path with stand-in libraries)")


@needs_cuda
@pytest.mark.parametrize("np_", [1, 2, 4])
def test_every_feature_on_cuda_tensors(np_):
    result = launch(np_, "torch_device_worker.py", "cuda", timeout=300)
    assert_all_ranks(result, np_, "torch cuda ok")
    shared = np_ > torch.cuda.device_count()
    assert ("(staged" in result.stdout) == shared, result.stdout
