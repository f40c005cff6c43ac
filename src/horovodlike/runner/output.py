"""Forwarding of the ranks' output: each line prefixed with its rank on the launcher's console
(`[1]<stdout>:line`), and, with --output-filename, the raw bytes in DIR/rank.<r>/stdout|stderr."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import BinaryIO

# A line longer than this is forwarded in pieces rather than held in memory whole.
_MAX_LINE_BYTES = 1 << 20


def lines_of(source: BinaryIO):
    """The lines read from `source` until end of file; a longer one than _MAX_LINE_BYTES comes
    in pieces. A pipe closed under the reader raises OSError or ValueError."""
    while line := source.readline(_MAX_LINE_BYTES):
        yield line


def rank_output_dir(base: str, rank: int, size: int) -> Path:
    """DIR/rank.<r>, the rank zero-padded to the width of the largest rank so names sort."""
    width = len(str(size - 1))
    return Path(base) / f"rank.{rank:0{width}d}"


class Console:
    """The launcher's stdout and stderr, written a whole line at a time from many threads."""

    def __init__(self, stdout: BinaryIO, stderr: BinaryIO, timestamps: bool = False):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._lock = threading.Lock()
        self._timestamps = timestamps  # --prefix-output-with-timestamp

    def write(self, stream: str, data: bytes, rank_line: bool = False) -> None:
        """Writes `data`; a rank's line (`[1]<stdout>:...`) starts with the local time, as
        `Wed Nov 25 05:20:49 2026[1]<stdout>:...`, when timestamps were asked for."""
        target = self._streams[stream]
        if rank_line and self._timestamps:
            data = time.asctime().encode() + data
        with self._lock:
            try:
                target.write(data)
                target.flush()
            except (BrokenPipeError, ValueError):
                pass  # nobody reads the console any more; keep draining the ranks

    def message(self, text: str, stream: str = "stderr") -> None:
        """A line of the launcher's own."""
        self.write(stream, f"horovodlikerun: {text}\n".encode())


class StreamForwarder(threading.Thread):
    """Reads one stream of one rank line by line until end of file."""

    def __init__(self, rank: int, stream: str, source: BinaryIO, console: Console,
                 raw_file: BinaryIO | None = None):
        super().__init__(daemon=True, name=f"rank{rank}-{stream}")
        self._prefix = f"[{rank}]<{stream}>:".encode()
        self._stream = stream
        self._source = source
        self._console = console
        self._raw_file = raw_file
        self.last_activity = time.monotonic()

    def run(self) -> None:
        try:
            for line in lines_of(self._source):
                self.last_activity = time.monotonic()
                if self._raw_file is not None:
                    self._raw_file.write(line)
                    self._raw_file.flush()
                if not line.endswith(b"\n"):
                    line += b"\n"
                self._console.write(self._stream, self._prefix + line, rank_line=True)
        except (OSError, ValueError):
            pass  # the pipe was closed under us: the job is being torn down
        finally:
            if self._raw_file is not None:
                self._raw_file.close()
            self._source.close()


def join_forwarders(forwarders: list[StreamForwarder], idle_timeout: float) -> None:
    """Waits until every forwarder reached end of file, giving up once none has had output for
    `idle_timeout` seconds (a rank's leftover child can keep a pipe open for ever)."""
    started = time.monotonic()
    for forwarder in forwarders:
        while forwarder.is_alive():
            forwarder.join(timeout=0.05)
            last_output = max([started] + [f.last_activity for f in forwarders])
            if time.monotonic() - last_output > idle_timeout:
                return
