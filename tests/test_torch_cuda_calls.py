"""The calls the torch layer makes into the core for CUDA tensors (contract: enqueue/run take
device= and the current stream, core-allocated outputs come back through output_to_device),
checked without a GPU: PyTorch's CPU build cannot make CUDA tensors, so a tensor that says it
is on cuda:1 stands in for one, torch.cuda.current_stream answers a made-up stream, and the core
is a recorder. What the core then does with the pointers is the GPU stand-in tests' part."""

import itertools
import re
import types

import numpy as np
import pytest
import torch

import horovodlike.torch as hvd
from horovodlike import _core
from horovodlike.common import requests
from horovodlike.torch import _queue, mpi_ops

STREAM_BASE = 1000  # the made-up stream of device i is 1000 + i


class OnCuda1(torch.Tensor):
    """A CPU tensor that the torch layer takes for a tensor on cuda:1."""

    @property
    def is_cuda(self):
        return True

    @property
    def is_cpu(self):
        return False

    @property
    def device(self):
        return torch.device("cuda", 1)


class RecordingCore:
    STATUS_OK = 0

    def __init__(self):
        self.calls = []
        self.shapes = {}
        self.handles = itertools.count(1)

    def enqueue(self, op, name, input, output, dtype, shape, **kwargs):
        handle = next(self.handles)
        self.calls.append(("enqueue", name, kwargs))
        self.shapes[handle] = [2 * shape[0], *shape[1:]]  # as if gathered from two ranks
        return handle

    def run(self, *args, **kwargs):
        self.calls.append(("run", args[1], args[10], kwargs))

    def wait(self, handle):
        return self.STATUS_OK, ""

    def waits(self):  # the completed waits, which release the names of done handles
        return 0

    def output(self, handle):  # a device output: no bytes on the host
        return np.zeros(0, dtype=np.uint8), self.shapes[handle], [4, 4]

    def output_to_device(self, handle, dst, stream):
        self.calls.append(("output_to_device", handle, dst, stream))

    def release(self, handle):
        pass


@pytest.fixture
def core(monkeypatch):
    recorder = RecordingCore()
    monkeypatch.setattr(_queue, "_core", recorder)  # the synchronous path
    monkeypatch.setattr(requests, "_core", recorder)  # handles (common/requests.py)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(
        cuda_stream=STREAM_BASE + torch.device(device).index))
    return recorder


@pytest.fixture
def made_on(monkeypatch):
    """Devices asked of torch.empty; a CUDA one gets a stand-in tensor."""
    real_empty, devices = torch.empty, []

    def empty(*shape, device=None, **kwargs):
        devices.append(device)
        tensor = real_empty(*shape, **kwargs)
        return tensor.as_subclass(OnCuda1) if device is not None and \
            torch.device(device).type == "cuda" else tensor
    monkeypatch.setattr(torch, "empty", empty)
    return devices


def cuda_tensor(*values):
    return torch.tensor(values, dtype=torch.float32).as_subclass(OnCuda1)


def test_synchronous_allreduce_passes_the_device_and_its_current_stream(core):
    hvd.allreduce_(cuda_tensor(1, 2, 3), name="sync")
    hvd.allreduce(cuda_tensor(1, 2, 3), name="out_of_place")
    assert core.calls == [("run", "sync", 1, {"stream": STREAM_BASE + 1}),
                          ("run", "out_of_place", 1, {"stream": STREAM_BASE + 1})]


def test_asynchronous_ops_pass_the_device_and_its_current_stream(core):
    tensor = cuda_tensor(1, 2)
    assert hvd.synchronize(hvd.allreduce_async_(tensor, name="inplace")) is tensor
    hvd.synchronize(hvd.grouped_allreduce_async([cuda_tensor(1), cuda_tensor(2)], name="grp"))
    enqueued = [(name, kwargs["device"], kwargs["stream"]) for _, name, kwargs in core.calls]
    assert enqueued == [("inplace", 1, STREAM_BASE + 1), ("grp.0", 1, STREAM_BASE + 1),
                        ("grp.1", 1, STREAM_BASE + 1)]


@pytest.mark.parametrize("start", [
    lambda t: hvd.allgather_async(t, name="op"),
    lambda t: hvd.reducescatter_async(t, name="op"),
    lambda t: hvd.grouped_allgather_async([t], name="op"),
])
def test_core_allocated_outputs_are_copied_to_a_new_tensor_on_the_device(core, made_on, start):
    result = hvd.synchronize(start(cuda_tensor(1, 2, 3, 4)))
    out = result[0] if isinstance(result, list) else result
    assert made_on == [torch.device("cuda", 1)]
    assert isinstance(out, OnCuda1) and out.shape == (8,) and out.dtype == torch.float32
    assert core.calls[-1] == ("output_to_device", 1, out.data_ptr(), STREAM_BASE + 1)


def test_alltoall_output_on_the_device_and_received_splits_on_the_host(core, made_on,
                                                                         monkeypatch):
    monkeypatch.setattr(mpi_ops, "set_ranks", lambda process_set: [0, 1])  # two ranks
    out, received = hvd.synchronize(hvd.alltoall_async(cuda_tensor(1, 2), name="a2a"))
    assert isinstance(out, OnCuda1) and made_on == [torch.device("cuda", 1)]
    assert received.device.type == "cpu" and received.tolist() == [4, 4]


def test_cpu_tensors_pass_no_device_and_no_stream(core):
    hvd.allreduce_(torch.ones(3), name="sync")
    hvd.synchronize(hvd.allreduce_async_(torch.ones(3), name="async"))
    gathered = hvd.synchronize(hvd.allgather_async(torch.ones(3), name="gather"))
    assert core.calls[0] == ("run", "sync", -1, {})
    assert [c[:2] for c in core.calls[1:]] == [("enqueue", "async"), ("enqueue", "gather")]
    assert not any({"device", "stream"} & set(c[2]) for c in core.calls[1:]), core.calls
    assert gathered.shape == (6,) and gathered.device.type == "cpu"


def test_the_core_takes_the_keywords_the_torch_layer_passes():
    for function in (_core.enqueue, _core.run):
        signature = function.__doc__.splitlines()[0]
        assert re.search(r"\bdevice: ", signature) and re.search(r"\bstream: ", signature), \
            signature
