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

Each connection has its own daemon thread, so a slow or broken client never blocks another;
a client that does not authenticate within AUTH_TIMEOUT_S is disconnected.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import select
import socket
import threading
import time

MAX_LINE_BYTES = 4096
AUTH_TIMEOUT_S = 10.0
NONCE_BYTES = 32
_CLIENT_CONTEXT = b"horovodlike rendezvous client"
_SERVER_CONTEXT = b"horovodlike rendezvous server"
# How often a blocked GET checks whether its client has gone away.
_DISCONNECT_CHECK_S = 0.5
# Before closing, how long and how much of a client's unread input to discard.
_DRAIN_TIMEOUT_S = 1.0
_DRAIN_LIMIT_BYTES = 1 << 20


class _LineTooLong(Exception):
    pass


def _proof(secret: str, server_nonce: bytes, client_nonce: bytes, context: bytes) -> str:
    return hmac.new(secret.encode(), server_nonce + client_nonce + context,
                    hashlib.sha256).hexdigest()


def _nonce(text: str) -> bytes | None:
    if len(text) != 2 * NONCE_BYTES:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def answer_hello(secret: str, hello: str) -> tuple[str, str]:
    """The client's side of the handshake. From the server's first line ("HELLO <nonce>",
    without "\\n"), returns the line to send ("AUTH ...") and the reply that proves the server
    knows the secret too ("OK <proof>"; compare it with hmac.compare_digest). Raises ValueError
    when `hello` is not a greeting of this protocol."""
    fields = hello.split(" ")
    server_nonce = _nonce(fields[1]) if len(fields) == 2 and fields[0] == "HELLO" else None
    if server_nonce is None:
        raise ValueError(f"not a horovodlike rendezvous server greeting: {hello[:60]!r}")
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    return (f"AUTH {client_nonce.hex()} "
            f"{_proof(secret, server_nonce, client_nonce, _CLIENT_CONTEXT)}",
            f"OK {_proof(secret, server_nonce, client_nonce, _SERVER_CONTEXT)}")


class _LineReader:
    """Reads "\\n"-terminated lines from a socket, refusing lines over MAX_LINE_BYTES."""

    def __init__(self, connection: socket.socket):
        self._connection = connection
        self._buffer = bytearray()

    def readline(self, deadline: float | None = None) -> bytes | None:
        """The next line without its "\\n"; None at end of stream or on a partial last line.
        With a deadline (time.monotonic()), raises socket.timeout once it has passed."""
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
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout("line not complete in time")
                self._connection.settimeout(remaining)
            chunk = self._connection.recv(MAX_LINE_BYTES)
            if not chunk:
                return None
            self._buffer += chunk


def _fields(line: bytes) -> list[str] | None:
    """The space-separated fields of a line, or None when it is not well-formed ASCII text."""
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        return None
    fields = text.split(" ")
    if any(not field or not field.isprintable() for field in fields):
        return None
    return fields


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
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
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
        listener.listen(128)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name="rendezvous-accept")
        self._accept_thread.start()
        return self.port

    def stop(self) -> None:
        """Stops accepting, disconnects every client and wakes blocked GETs."""
        self._stopping.set()
        with self._store_changed:
            self._store_changed.notify_all()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=2)

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

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.01)  # e.g. out of file descriptors: keep serving the others
                continue
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True,
                                      name="rendezvous-client")
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(connection)
            self._send_locks[connection] = threading.Lock()
        try:
            self._serve_requests(connection)
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

    def _serve_requests(self, connection: socket.socket) -> None:
        reader = _LineReader(connection)
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        self._send(connection, f"HELLO {server_nonce.hex()}")
        line = reader.readline(deadline=time.monotonic() + self._auth_timeout)
        if line is None:
            return
        fields = _fields(line)
        client_nonce = _nonce(fields[1]) if fields and len(fields) == 3 else None
        secret = self._secret.decode("ascii")
        if (client_nonce is None or fields[0] != "AUTH" or not hmac.compare_digest(
                fields[2].encode("ascii"),
                _proof(secret, server_nonce, client_nonce, _CLIENT_CONTEXT).encode("ascii"))):
            self._send(connection, "ERROR bad secret")
            return
        connection.settimeout(None)
        self._send(connection, f"OK {_proof(secret, server_nonce, client_nonce, _SERVER_CONTEXT)}")
        with self._connections_lock:
            self._authenticated.add(connection)

        while not self._stopping.is_set():
            line = reader.readline()
            if line is None:
                return
            fields = _fields(line)
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
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        drained = 0
        while drained < _DRAIN_LIMIT_BYTES:
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
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
