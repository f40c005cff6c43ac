"""What every framework module shares. Importing it tells the core where NVIDIA's CUDA and NCCL
wheels are (gpu_libraries.py), before anything can use a GPU."""

from horovodlike.common import gpu_libraries as _gpu_libraries

_gpu_libraries.register_with_core()
