"""The driver's end of ray_logger: a Ray queue the workers put their logged values into, and
the user's callbacks, each called on each value in arrival order."""

from __future__ import annotations

from typing import Any, Callable


def check_callbacks(callbacks) -> list[Callable[[Any], Any]]:
    """The callbacks as a list, after making sure each can be called."""
    callbacks = list(callbacks or ())
    for index, callback in enumerate(callbacks):
        if not callable(callback):
            raise TypeError(f"callbacks[{index}] is a {type(callback).__name__}, not a callable"
                            "; give functions or objects with __call__")
    return callbacks


class CallbackRelay:
    """Holds the queue while one call runs. deliver() hands what has arrived to the callbacks;
    a callback that raises stops the relay and its error is raised by close()."""

    def __init__(self, callbacks: list[Callable[[Any], Any]]):
        from ray.util.queue import Queue
        self.callbacks = callbacks
        # No CPU: the queue must never wait for, or take, the workers' resources.
        self.queue = Queue(actor_options={"num_cpus": 0})
        self._error: BaseException | None = None

    def deliver(self) -> None:
        if self._error is not None:
            return
        count = self.queue.qsize()
        if count == 0:
            return
        for value in self.queue.get_nowait_batch(count):
            for callback in self.callbacks:
                try:
                    callback(value)
                except Exception as error:  # raised by close(), after the workers are done
                    self._error = error
                    return

    def close(self) -> None:
        """Delivers the values still queued (a worker's put() returns once its value is in
        the queue, so every value logged before the call returned is there), frees the
        queue, and raises a callback's error."""
        try:
            self.deliver()
        finally:
            self.queue.shutdown()
        if self._error is not None:
            raise RuntimeError(f"a callback raised {type(self._error).__name__}: "
                               f"{self._error}") from self._error
