"""horovodlike: data-parallel training for PyTorch, TensorFlow and Keras with a native core.

Import the framework module you train with, as with Horovod:
``import horovodlike.torch as hvd``.
"""

__version__ = "0.1.0"

# Tells the core where NVIDIA's CUDA and NCCL wheels are, before anything can ask it for them
# (common/gpu_libraries.py).
import horovodlike.common  # noqa: E402,F401
