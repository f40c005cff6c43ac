"""The variables of Keras objects that the TensorFlow and Keras layers both ask for: an
optimizer's state, and the trainable variables of layers each rank keeps for itself."""


def optimizer_variables(optimizer):
    """Every variable of a Keras optimizer (its iteration count, learning rate and slots)."""
    variables = getattr(optimizer, "variables", [])
    return list(variables() if callable(variables) else variables)


def local_layer_variables(local_layers, what):
    """The trainable variables of ``local_layers`` (one Keras layer or a list of them)."""
    if local_layers is None:
        return []
    # Deferred: horovodlike.tensorflow imports Keras only when a Keras object is involved
    # (importing it is slow, and a script may have set Keras to another backend).
    import keras
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    variables = []
    for layer in local_layers:
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(f"{what}: local_layers must hold Keras layers, got "
                            f"{type(layer).__name__}")
        variables.extend(layer.trainable_weights)
    return variables
