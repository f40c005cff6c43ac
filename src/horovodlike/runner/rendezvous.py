"""The rendezvous server: a key-value store over TCP through which ranks find each other.

Protocol (the core's C++ client implements the other side). Lines end with "\\n", fields are
separated by one space, keys and values contain no whitespace, and a line is at most
MAX_LINE_BYTES bytes counting its "\\n" (a longer one is answered "ERROR line too long" and the
connection is closed).

    client                               server
                                         HELLO <server_nonce>            on connect
    AUTH <client_nonce> <client_proof>   OK <server_proof> | ERROR bad secret (then close)
    PUT <key> <value>                    OK                              overwrites
    GET <key> <timeout_ms>               VALUE <value> | TIMEOUT         blocks until set
    anything else                        ERROR unknown request (then close)

Authentication is mutual and the secret never crosses the wire: nonces are NONCE_BYTES random
bytes, proofs HMAC-SHA256(secret, server_nonce || client_nonce || context) with the context
b"horovodlike rendezvous client" for the client's proof and b"... server" for the server's, all
in lower-case hex (see answer_hello for the client's side).

Once the launcher stops the job (abort()), a GET of a key that is not set is answered
"ABORTED <reason>" (the reason is the rest of the line) instead of waiting, a blocked GET at
once; and each client authenticated by then is sent "ABORT <reason>" unasked, once, so that a
rank waiting on its peers during set-up learns it at once (a client skips that line when it
waits for a reply). PUT, and GET of a key that is set, go on working: ranks that fail
afterwards still report why (failures.py).

One thread accepts every connection and runs its authentication in an event loop
(rendezvous_auth.py): a client that connects and says nothing, even among thousands, never holds
up another, a client that does not authenticate within AUTH_TIMEOUT_S is disconnected, and the
connections still authenticating are capped below the file-descriptor limit. Each authenticated
connection has its own daemon thread, so a slow client never blocks another.
"""

from __future__ import annotations

import select
import socket
import threading
import time

from horovodlike.runner.rendezvous_auth import (  # noqa: F401 (answer_hello: the client's side)
    AUTH_TIMEOUT_S, DRAIN_LIMIT_BYTES, DRAIN_TIMEOUT_S, MAX_LINE_BYTES, FrontDoor, answer_hello,
    fields_of)

# How often a blocked GET checks whether its client has gone away.
_DISCONNECT_CHECK_S = 0.5
# The greatest backlog of connections not accepted yet (the system caps it at
# net.core.somaxconn): a crowd of strangers must not fill it before the ranks connect.
_LISTEN_BACKLOG = 4096


class _LineTooLong(Exception):
    pass


class _LineReader:
    """Reads "\\n"-terminated lines from an authenticated client (after `already_read`, what
    it sent behind its AUTH line), refusing lines over MAX_LINE_BYTES."""

    def __init__(self, connection: socket.socket, already_read: bytes = b""):
        self._connection = connection
        self._buffer = bytearray(already_read)

    def readline(self) -> bytes | None:
        """The next line without its "\\n"; None at end of stream or on a partial last line."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                if end + 1 > MAX_LINE_BYTES:
                    raise _LineTooLong()
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                return line
            if len(self._buffer) >= MAX_LINE_BYTES:
                raise _LineTooLong()
            chunk = self._connection.recv(MAX_LINE_BYTES)
            if not chunk:
                return None
            self._buffer += chunk


class RendezvousServer:
    """A threaded TCP key-value server guarded by a shared secret.

    server = RendezvousServer(secret_hex, host="127.0.0.1"); server.start()
    ... server.port, server.keys(), server.get(key) ...
    server.stop()
    """

    def __init__(self, secret: str, host: str = "127.0.0.1", port: int = 0,
                 auth_timeout: float = AUTH_TIMEOUT_S):
        self._secret = secret.encode("ascii")
        self._host = host
        self._requested_port = port
        self._auth_timeout = auth_timeout
        self._store: dict[str, str] = {}
        self._store_changed = threading.Condition()
        self._front_door: FrontDoor | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._send_locks: dict[socket.socket, threading.Lock] = {}
        self._authenticated: set[socket.socket] = set()
        self._abort_reason: str | None = None
        self._stopping = threading.Event()
        self.port: int | None = None

    @property
    def host(self) -> str:
        return self._host

    def start(self) -> int:
        """Binds, starts accepting, and returns the port (chosen by the OS when port=0)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, self._requested_port))
        listener.listen(_LISTEN_BACKLOG)
        self.port = listener.getsockname()[1]
        self._front_door = FrontDoor(listener, self._secret.decode("ascii"), self._auth_timeout,
                                     self._start_serving)
        self._front_door.start()
        return self.port

    def stop(self) -> None:
        """Stops accepting, disconnects every client and wakes blocked GETs."""
        self._stopping.set()
        with self._store_changed:
            self._store_changed.notify_all()
        if self._front_door is not None:
            self._front_door.stop()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def abort(self, reason: str) -> None:
        """Tells the ranks that the job is being stopped: a GET blocked now or later on a key
        that is not set is answered "ABORTED <reason>", and each authenticated client is sent
        "ABORT <reason>" at once."""
        reason = " ".join(reason.split()) or "stopped"
        with self._store_changed:
            if self._abort_reason is not None:
                return
            self._abort_reason = reason
            self._store_changed.notify_all()
        with self._connections_lock:
            clients = list(self._authenticated)
        for connection in clients:
            self._send(connection, f"ABORT {reason}")

    @property
    def aborted(self) -> bool:
        return self._abort_reason is not None

    def keys(self) -> set[str]:
        """The keys set so far."""
        with self._store_changed:
            return set(self._store)

    def get(self, key: str) -> str | None:
        with self._store_changed:
            return self._store.get(key)

    def pop(self, key: str) -> str | None:
        """Removes the key and returns its value (None when it was not set): for values the
        driver consumes, such as the Spark ranks' output."""
        with self._store_changed:
            return self._store.pop(key, None)

    def put(self, key: str, value: str) -> None:
        with self._store_changed:
            self._store[key] = value
            self._store_changed.notify_all()

    def _start_serving(self, connection: socket.socket, reply: str, already_read: bytes) -> None:
        """Called by the front door with a connection that has just authenticated."""
        with self._connections_lock:
            self._connections.add(connection)
            self._send_locks[connection] = threading.Lock()
        thread = threading.Thread(target=self._serve, args=(connection, reply, already_read),
                                  daemon=True, name="rendezvous-client")
        thread.start()

    def _serve(self, connection: socket.socket, reply: str, already_read: bytes) -> None:
        try:
            self._send(connection, reply)
            with self._connections_lock:
                self._authenticated.add(connection)
            self._serve_requests(_LineReader(connection, already_read), connection)
        except (OSError, _LineTooLong) as error:
            if isinstance(error, _LineTooLong):
                self._send(connection, "ERROR line too long")
        except Exception:  # a bug must cost one connection, never the server
            pass
        finally:
            with self._connections_lock:
                self._connections.discard(connection)
                self._authenticated.discard(connection)
            _close_gracefully(connection)
            with self._connections_lock:
                self._send_locks.pop(connection, None)

    def _send(self, connection: socket.socket, line: str) -> None:
        """Sends one line whole: abort() may write to a connection its own thread serves."""
        with self._connections_lock:
            lock = self._send_locks.get(connection)
        if lock is None:
            return
        with lock:
            try:
                connection.sendall(line.encode("ascii", "replace") + b"\n")
            except OSError:
                pass

    def _serve_requests(self, reader: _LineReader, connection: socket.socket) -> None:
        while not self._stopping.is_set():
            line = reader.readline()
            if line is None:
                return
            fields = fields_of(line)
            if fields and fields[0] == "PUT" and len(fields) == 3:
                self.put(fields[1], fields[2])
                self._send(connection, "OK")
            elif (fields and fields[0] == "GET" and len(fields) == 3
                  and fields[2].isdigit()):
                value = self._wait_for(connection, fields[1], int(fields[2]) / 1000.0)
                if self._abort_reason is not None and value is None:
                    self._send(connection, f"ABORTED {self._abort_reason}")
                else:
                    self._send(connection, "TIMEOUT" if value is None else f"VALUE {value}")
            else:
                self._send(connection, "ERROR unknown request")
                return

    def _wait_for(self, connection: socket.socket, key: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        with self._store_changed:
            while key not in self._store:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping.is_set() or self._abort_reason is not None:
                    return None
                self._store_changed.wait(min(remaining, _DISCONNECT_CHECK_S))
                if key not in self._store and _peer_closed(connection):
                    raise ConnectionResetError("client went away during GET")
            return self._store[key]


def _close_gracefully(connection: socket.socket) -> None:
    """Closes after the client has read our last line: closing with unread input pending would
    send a reset, which can destroy the error reply before the client reads it."""
    try:
        connection.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        drained = 0
        while drained < DRAIN_LIMIT_BYTES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            connection.settimeout(remaining)
            chunk = connection.recv(65536)
            if not chunk:
                break
            drained += len(chunk)
    except OSError:
        pass
    finally:
        connection.close()


def _peer_closed(connection: socket.socket) -> bool:
    # poll, not select: a descriptor numbered 1024 or more is beyond select's reach.
    poller = select.poll()
    poller.register(connection, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
