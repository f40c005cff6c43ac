"""The rendezvous server's front door: the event loop that runs the server's side of the
handshake (common/rendezvous_handshake.py) for every new connection (rendezvous.py documents the
protocol).

One thread accepts and authenticates every connection with non-blocking sockets, so a client
that connects and says nothing, or drips its first line, never holds up another. Each
connection must send a whole AUTH line within the auth timeout of being accepted. Connections
still authenticating are capped (a quarter of the process's file-descriptor limit, within
[MIN_PENDING, MAX_PENDING]); at the cap, the one heard from least recently is dropped to make
room, so a crowd of silent strangers can neither exhaust the descriptors nor keep a rank out:
a rank answers the greeting within a round trip. Only an authenticated connection gets a
thread of its own (RendezvousServer serves its requests).
"""

from __future__ import annotations

import errno
import resource
import secrets
import selectors
import socket
import threading
import time
from typing import Callable

from horovodlike.common.rendezvous_handshake import (  # noqa: F401 (answer_hello, fields_of: rendezvous.py's)
    NONCE_BYTES, answer_hello, check_auth, fields_of)

MAX_LINE_BYTES = 4096
AUTH_TIMEOUT_S = 10.0
MIN_PENDING = 16
MAX_PENDING = 1024
# Accepted in a row before the connections already accepted are served again (and at most half
# the cap, so that a rank is heard before the connections accepted after it could push it out).
_ACCEPT_BATCH = 64
# Out of file descriptors with no connection to drop: how long the listener rests.
_LISTENER_PAUSE_S = 0.05
# Before closing a refused connection, how long and how much of its unread input to discard:
# closing with unread input pending would send a reset, which can destroy the reply.
DRAIN_TIMEOUT_S = 1.0
DRAIN_LIMIT_BYTES = 1 << 20
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def pending_cap() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_PENDING
    return max(MIN_PENDING, min(MAX_PENDING, soft // 4))


class _Pending:
    """A connection not authenticated yet, or refused and being closed."""

    def __init__(self, connection: socket.socket, nonce: bytes, deadline: float):
        self.connection = connection
        self.nonce = nonce
        self.buffer = bytearray()
        self.deadline = deadline
        self.last_heard = time.monotonic()
        self.closing = False  # refused: its reply is sent, its input discarded until it closes
        self.drained = 0


# Called with an authenticated connection (blocking again), the reply that completes its
# handshake ("OK <proof>", not sent yet) and the bytes it sent after its AUTH line.
OnAuthenticated = Callable[[socket.socket, str, bytes], None]


class FrontDoor:
    """Accepts on `listener` and authenticates each connection; runs in its own thread."""

    def __init__(self, listener: socket.socket, secret: str, auth_timeout: float,
                 on_authenticated: OnAuthenticated):
        self._listener = listener
        self._secret = secret
        self._auth_timeout = auth_timeout
        self._on_authenticated = on_authenticated
        self._cap = pending_cap()
        self._selector = selectors.DefaultSelector()
        self._pending: set[_Pending] = set()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._listener_paused_until: float | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_reader, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, daemon=True, name="rendezvous-accept")
        self._thread.start()

    def stop(self) -> None:
        """Stops accepting; closes the listener and every connection not authenticated."""
        self._stopping.set()
        try:
            self._wake_writer.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                for key, _ in self._selector.select(self._expire_and_wait()):
                    try:
                        if key.data == "listener":
                            self._accept_some()
                        elif isinstance(key.data, _Pending):
                            self._serve(key.data)
                    except Exception:  # a bug must cost one connection, never the server
                        if isinstance(key.data, _Pending) and key.data in self._pending:
                            self._discard(key.data)
                self._resume_listener()
        finally:
            for pending in list(self._pending):
                self._discard(pending)
            self._selector.close()
            for sock in (self._listener, self._wake_reader, self._wake_writer):
                sock.close()

    def _expire_and_wait(self) -> float:
        """Drops the connections past their deadline; returns how long select may wait."""
        now = time.monotonic()
        wait = 0.5
        for pending in list(self._pending):
            if now >= pending.deadline:
                self._discard(pending)
            else:
                wait = min(wait, pending.deadline - now)
        if self._listener_paused_until is not None:
            wait = min(wait, max(0.0, self._listener_paused_until - now))
        return wait

    def _resume_listener(self) -> None:
        if (self._listener_paused_until is not None
                and time.monotonic() >= self._listener_paused_until):
            self._listener_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")

    def _accept_some(self) -> None:
        for _ in range(min(_ACCEPT_BATCH, self._cap // 2)):
            if len(self._pending) >= self._cap:
                self._drop_quietest()
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in _OUT_OF_DESCRIPTORS:
                    # A quiet connection makes room, or the listener rests a little.
                    if self._pending:
                        self._drop_quietest()
                        continue
                    self._selector.unregister(self._listener)
                    self._listener_paused_until = time.monotonic() + _LISTENER_PAUSE_S
                return  # ECONNABORTED and the like: the next event tries again
            self._greet(connection)

    def _greet(self, connection: socket.socket) -> None:
        connection.setblocking(False)
        nonce = secrets.token_bytes(NONCE_BYTES)
        try:
            # A fresh connection's send buffer always has room for the greeting.
            connection.send(f"HELLO {nonce.hex()}\n".encode("ascii"))
        except OSError:
            connection.close()
            return
        pending = _Pending(connection, nonce, time.monotonic() + self._auth_timeout)
        self._pending.add(pending)
        self._selector.register(connection, selectors.EVENT_READ, pending)

    def _serve(self, pending: _Pending) -> None:
        if pending not in self._pending:  # dropped earlier in this round of events
            return
        try:
            chunk = pending.connection.recv(65536 if pending.closing else MAX_LINE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._discard(pending)
            return
        pending.last_heard = time.monotonic()
        if pending.closing:
            pending.drained += len(chunk)
            if pending.drained >= DRAIN_LIMIT_BYTES:
                self._discard(pending)
            return
        pending.buffer += chunk
        end = pending.buffer.find(b"\n")
        if end + 1 > MAX_LINE_BYTES or (end < 0 and len(pending.buffer) >= MAX_LINE_BYTES):
            self._refuse(pending, "ERROR line too long")
        elif end >= 0:
            reply = check_auth(self._secret, pending.nonce, bytes(pending.buffer[:end]))
            if reply is None:
                self._refuse(pending, "ERROR bad secret")
                return
            self._forget(pending)
            try:
                pending.connection.setblocking(True)
                self._on_authenticated(pending.connection, reply,
                                       bytes(pending.buffer[end + 1:]))
            except Exception:  # e.g. no thread to be had: this client goes, the server stays
                pending.connection.close()

    def _refuse(self, pending: _Pending, reply: str) -> None:
        """Sends the reply, then discards what the client still sends until it closes (or for
        DRAIN_TIMEOUT_S at most), so that the reply reaches it."""
        try:
            pending.connection.send(reply.encode("ascii") + b"\n")
            pending.connection.shutdown(socket.SHUT_WR)
        except OSError:
            self._discard(pending)
            return
        pending.closing = True
        pending.deadline = time.monotonic() + DRAIN_TIMEOUT_S

    def _drop_quietest(self) -> None:
        if self._pending:
            self._discard(min(self._pending, key=lambda pending: pending.last_heard))

    def _forget(self, pending: _Pending) -> None:
        self._pending.discard(pending)
        self._selector.unregister(pending.connection)

    def _discard(self, pending: _Pending) -> None:
        self._forget(pending)
        pending.connection.close()
