"""horovodlike: data-parallel training for PyTorch, TensorFlow and Keras with a native core.

Import the framework module you train with, as with Horovod:
``import horovodlike.torch as hvd``.
"""

__version__ = "0.1.0"
