"""horovodlike.tensorflow.keras: the API of ``horovod.tensorflow.keras``. Since TensorFlow 2.16,
tf.keras is Keras 3, so this is the same module as horovodlike.keras."""

from horovodlike.keras import *  # noqa: F401,F403
from horovodlike.keras import __all__  # noqa: F401
