"""Python client of the launcher's rendezvous server (runner/rendezvous.py documents the
protocol), used by the ranks: elastic workers join rounds and hear about host changes through it,
and every rank the launcher started watches the launcher with it (launcher_watch.py)."""

from __future__ import annotations

import hmac
import os
import socket

from horovodlike.common.rendezvous_handshake import answer_hello


class RendezvousError(RuntimeError):
    pass


class RendezvousClient:
    def __init__(self, address: str, port: int, secret: str, timeout: float = 30.0):
        self._endpoint = f"{address}:{port}"
        try:
            self._socket = socket.create_connection((address, port), timeout=timeout)
        except OSError as error:
            raise RendezvousError(f"cannot reach the rendezvous server at {self._endpoint}: "
                                  f"{error}") from None
        self._reader = self._socket.makefile("rb")
        self._authenticate(secret)

    @classmethod
    def from_environment(cls) -> "RendezvousClient":
        try:
            return cls(os.environ["HOROVOD_RENDEZVOUS_ADDR"],
                       int(os.environ["HOROVOD_RENDEZVOUS_PORT"]),
                       os.environ["HOROVOD_SECRET_KEY"])
        except KeyError as missing:
            raise RendezvousError(f"{missing.args[0]} is not set: start the job with "
                                  "horovodlikerun") from None

    def _authenticate(self, secret: str) -> None:
        # Mutual HMAC challenge (see rendezvous.py): the secret itself is never sent.
        try:
            hello = self._reader.readline().decode("ascii", "replace").rstrip("\n")
            line, expected = answer_hello(secret, hello)
        except (OSError, ValueError) as error:
            raise RendezvousError(f"rendezvous server {self._endpoint}: {error}") from None
        reply = self._call(line)
        if not reply.startswith("OK "):
            raise RendezvousError(f"the rendezvous server refused this job's secret: {reply}")
        if not hmac.compare_digest(reply, expected):
            raise RendezvousError(f"rendezvous server {self._endpoint} could not prove that it "
                                  "knows this job's secret; it is not this job's launcher")

    def _call(self, line: str, timeout: float | None = None) -> str:
        try:
            if timeout is not None:
                self._socket.settimeout(timeout)
            self._socket.sendall(line.encode() + b"\n")
            reply = self._reader.readline()
        except OSError as error:
            raise RendezvousError(f"rendezvous server {self._endpoint}: {error}") from None
        if not reply:
            raise RendezvousError(f"rendezvous server {self._endpoint} closed the connection")
        return reply.decode().rstrip("\n")

    def put(self, key: str, value: str) -> None:
        reply = self._call(f"PUT {key} {value}")
        if reply != "OK":
            raise RendezvousError(f"PUT {key} failed: {reply}")

    def get(self, key: str, timeout_s: float) -> str | None:
        """The key's value, or None if it is not set within timeout_s."""
        reply = self._call(f"GET {key} {int(timeout_s * 1000)}", timeout=timeout_s + 30.0)
        if reply == "TIMEOUT":
            return None
        if not reply.startswith("VALUE "):
            raise RendezvousError(f"GET {key} failed: {reply}")
        return reply[len("VALUE "):]

    def wait_until_closed(self) -> str:
        """Blocks until the server ends this connection, skipping the lines it sends unasked
        ("ABORT ..."), and says how it ended. TCP keepalive probes end it when the server's host
        stops answering (about 25 s), as its process ending does at once."""
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                self._socket.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        self._socket.settimeout(None)
        try:
            while self._reader.readline():
                pass
        except OSError as error:
            return f"rendezvous server {self._endpoint}: {error}"
        return f"rendezvous server {self._endpoint} closed the connection"

    def close(self) -> None:
        self._reader.close()
        self._socket.close()
