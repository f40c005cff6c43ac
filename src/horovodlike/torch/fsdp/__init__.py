"""Parameter sharding under the names of PyTorch's FSDP2 (``torch.distributed.fsdp``):
``fully_shard`` each block and then the root; see docs/model-parallel.md."""

from horovodlike.torch.fsdp.device_mesh import DeviceMesh, init_device_mesh
from horovodlike.torch.fsdp.fully_shard import FSDPModule, fully_shard
from horovodlike.torch.fsdp.policy import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from horovodlike.torch.fsdp.shard_layout import Shard
from horovodlike.torch.fsdp.state_dict import (full_state_dict, load_full_state_dict,
                                                local_shards)

__all__ = ["CPUOffloadPolicy", "DeviceMesh", "FSDPModule", "MixedPrecisionPolicy",
           "OffloadPolicy", "Shard", "fully_shard", "full_state_dict", "init_device_mesh",
           "load_full_state_dict", "local_shards"]
