"""The TensorFlow error classes Horovod's collectives raise, given to ours.

Horovod's collectives are TensorFlow ops, so what they raise are ``tf.errors``: a disagreement
between ranks (shape, dtype, root rank) is ``tf.errors.FailedPreconditionError`` and a bad
argument ``tf.errors.InvalidArgumentError``; code migrated from Horovod catches those. Our
exceptions keep their own classes as well (TensorMismatchError, ValueError, TypeError), so code
written for either catches them.

Inside a graph (tf.function or a TensorFlow 1 session) a collective runs in a
``tf.numpy_function`` node, and TensorFlow turns what such a node raises into
``tf.errors.UnknownError`` (ValueError and TypeError into ``InvalidArgumentError``). For a
mismatch the node therefore returns its message instead of raising, and a second node raises it
as a FailedPreconditionError (see ``checked``).
"""

import functools

import tensorflow as tf

from horovodlike.common import exceptions


class TensorMismatchError(exceptions.TensorMismatchError, tf.errors.FailedPreconditionError):
    """The ranks disagreed about one collective; caught as either class."""

    def __init__(self, message):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


class InvalidArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """A bad argument, found before anything was sent; caught as either class."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


class InvalidTypeError(TypeError, tf.errors.InvalidArgumentError):
    """A tensor or argument of the wrong type; caught as either class."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def as_tf_error(error):
    """``error`` with the TensorFlow class Horovod would raise for it as well, or unchanged."""
    if isinstance(error, (tf.errors.OpError, exceptions.HostsUpdatedInterrupt)):
        return error
    if isinstance(error, exceptions.TensorMismatchError):
        return TensorMismatchError(str(error))
    if isinstance(error, ValueError):
        return InvalidArgumentError(str(error))
    if isinstance(error, TypeError):
        return InvalidTypeError(str(error))
    return error


def raises_tf_errors(function):
    """Decorates a public collective so that its errors carry the TensorFlow classes too."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (ValueError, TypeError, exceptions.TensorMismatchError) as e:
            translated = as_tf_error(e)
            if translated is e:
                raise
            raise translated from e
    return wrapper


# TensorFlow's ops that fail with FailedPrecondition do so with messages of their own (a table or
# an iterator not initialized), except file system calls, whose errno TensorFlow maps to a code
# and whose message carries the path: reading a path below /dev/null (a file on every POSIX
# system) fails with ENOTDIR, which is FailedPrecondition, while reading /dev/null itself
# succeeds. One read per collective node, with no branch: a tf.cond would add two functions to
# the graph per node, which a TensorFlow 1 session serializes again at every run.
_NULL = "/dev/null"
_MAX_MESSAGE = 3000  # below the path length limit, which would fail with another code


def status_path(message):
    """What a collective node returns as its status: empty when it succeeded, else the path
    below /dev/null that carries ``message`` (bytes)."""
    if not message:
        return b""
    return b"/" + message[:_MAX_MESSAGE].replace(b"\0", b" ")


def checked(outputs, status):
    """``outputs`` of a collective node, made to depend on a read that raises
    tf.errors.FailedPreconditionError with the message in ``status`` (from status_path) when it
    is not empty; otherwise it reads /dev/null, which is empty. The dependency is through the
    data (each output's shape plus the empty read's length): a read only depended on by control
    edges is pruned by TensorFlow's graph optimizer, as it has no side effect."""
    zero = tf.strings.length(tf.io.read_file(tf.strings.join([_NULL, status])))
    return [tf.reshape(t, tf.shape(t, out_type=tf.int32) + zero) for t in outputs]
