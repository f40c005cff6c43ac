"""The ranks' output on the Spark driver, as horovodlikerun shows it: every line a rank's process
writes to its stdout or stderr (Python's, the core's log lines, a library's C code) reaches the
driver while the job runs, as `[rank]<stdout>:line`, with its time in front when
prefix_output_with_timestamp asks for it.

Executors may be on other machines, so the lines travel through the job's rendezvous server:
a sender puts numbered batches under spark/output/<sender>/<n>, the driver takes them in order.
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import threading
import time

from horovodlike.common.rendezvous_client import RendezvousClient, RendezvousError

OUTPUT_PREFIX = "spark/output/"
_SEND_EVERY_S = 0.2
_BATCH_CHARS = 2400  # JSON per batch: in base64, with its key, under the protocol's 4 KiB line
_READ_BYTES = 1 << 20  # a longer line is sent in pieces
_READER_JOIN_S = 5.0  # a child process of the rank may hold a pipe open: stop waiting then


def encode_batch(label: str, lines: list[list[str]]) -> str:
    return base64.urlsafe_b64encode(json.dumps([label, lines]).encode()).decode("ascii")


def decode_batch(value: str) -> tuple[str, list[list[str]]]:
    label, lines = json.loads(base64.urlsafe_b64decode(value.encode()).decode())
    return label, lines


def batches(lines: list[list[str]]) -> list[list[list[str]]]:
    """The lines ([stream, time, text]) in groups of at most _BATCH_CHARS of JSON, a longer
    text cut in pieces."""
    groups: list[list[list[str]]] = [[]]
    size = 0
    for stream, stamp, text in lines:
        pieces = [text[i:i + _BATCH_CHARS // 2] for i in range(0, len(text), _BATCH_CHARS // 2)]
        for piece in pieces or [""]:
            cost = len(json.dumps([stream, stamp, piece]))
            if groups[-1] and size + cost > _BATCH_CHARS:
                groups.append([])
                size = 0
            groups[-1].append([stream, stamp, piece])
            size += cost
    return [group for group in groups if group]


class OutputSender:
    """Sends one process's lines to the driver, a batch every _SEND_EVERY_S and the rest at
    close(). `label`: what the driver shows in brackets (the rank)."""

    def __init__(self, job, sender: str, label: str, with_timestamps: bool):
        self._job = job
        self._key = f"{OUTPUT_PREFIX}{sender}/"
        self._label = label
        self._with_timestamps = with_timestamps
        self._pending: list[list[str]] = []
        self._lock = threading.Lock()
        self._sent = 0
        self._client = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._send_periodically, daemon=True,
                                        name="spark-output")
        self._thread.start()

    def add(self, stream: str, text: str) -> None:
        stamp = time.asctime() if self._with_timestamps else ""
        with self._lock:
            if not self._closed.is_set():
                self._pending.append([stream, stamp, text])

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._send()
        if self._client is not None:
            self._client.close()

    def _send_periodically(self) -> None:
        while not self._closed.wait(_SEND_EVERY_S):
            self._send()

    def _send(self) -> None:
        with self._lock:
            lines, self._pending = self._pending, []
        if not lines:
            return
        try:
            if self._client is None:
                self._client = RendezvousClient(self._job.rendezvous_addr,
                                                self._job.rendezvous_port,
                                                self._job.secret_key, timeout=10.0)
            for group in batches(lines):
                self._client.put(f"{self._key}{self._sent}", encode_batch(self._label, group))
                self._sent += 1
        except (RendezvousError, OSError):
            pass  # the driver is gone: nobody is left to show the lines to


class PipeReader(threading.Thread):
    """Reads one stream of a process line by line into a sender, until end of file."""

    def __init__(self, source, stream: str, sender: OutputSender):
        super().__init__(daemon=True, name=f"spark-{stream}")
        self._source = source  # a binary file object
        self._stream = stream
        self._sender = sender

    def run(self) -> None:
        try:
            while line := self._source.readline(_READ_BYTES):
                self._sender.add(self._stream, line.decode(errors="replace").rstrip("\n"))
        except (OSError, ValueError):
            pass
        finally:
            self._source.close()


class CapturedOutput:
    """For the duration of a `with` block in a Spark task, file descriptors 1 and 2 (and
    Python's sys.stdout/sys.stderr, line-buffered onto them) go to pipes read into a sender;
    afterwards they are what they were (Spark reuses the process)."""

    def __init__(self, sender: OutputSender):
        self._sender = sender
        self._saved_fds: dict[int, int] = {}
        self._saved_streams = None
        self._readers: list[PipeReader] = []

    def __enter__(self) -> "CapturedOutput":
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        self._saved_streams = sys.stdout, sys.stderr
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            self._saved_fds[fd] = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            reader = PipeReader(os.fdopen(read_end, "rb"), name, self._sender)
            reader.start()
            self._readers.append(reader)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True,
                                      errors="backslashreplace")
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True,
                                      errors="backslashreplace")
        return self

    def __exit__(self, *_) -> None:
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        sys.stdout, sys.stderr = self._saved_streams
        # Putting the saved descriptors back drops this process's last write ends of the
        # pipes: the readers reach end of file once the lines written so far are read.
        for fd, saved in self._saved_fds.items():
            os.dup2(saved, fd)
            os.close(saved)
        deadline = time.monotonic() + _READER_JOIN_S
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        self._sender.close()


def _flush(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


class OutputForwarder(threading.Thread):
    """In the driver: takes the senders' batches from the rendezvous server in order and
    writes their lines to stdout/stderr (default: this process's, looked up at each write)."""

    def __init__(self, server, stdout=None, stderr=None, poll_s: float = 0.1):
        super().__init__(daemon=True, name="spark-output-forwarder")
        self._server = server
        self._targets = {"stdout": stdout, "stderr": stderr}
        self._poll_s = poll_s
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self._poll_s):
            self.drain()

    def stop(self) -> None:
        """Stops polling and writes what the senders have put so far."""
        self._stopping.set()
        self.join()
        self.drain()

    def drain(self) -> None:
        with self._lock:
            senders = {key[len(OUTPUT_PREFIX):].rsplit("/", 1)[0]
                       for key in self._server.keys() if key.startswith(OUTPUT_PREFIX)}
            for sender in sorted(senders):
                while True:
                    number = self._next.get(sender, 0)
                    value = self._server.pop(f"{OUTPUT_PREFIX}{sender}/{number}")
                    if value is None:
                        break
                    self._next[sender] = number + 1
                    label, lines = decode_batch(value)
                    for stream, stamp, text in lines:
                        self._write(stream, f"{stamp}[{label}]<{stream}>:{text}\n")

    def _write(self, stream: str, text: str) -> None:
        target = self._targets.get(stream) or (sys.stdout if stream == "stdout" else sys.stderr)
        try:
            target.write(text)
            target.flush()
        except (OSError, ValueError):
            pass  # nobody reads the driver's output any more
