"""A minimal client of the launcher's rendezvous protocol, for test ranks (stdlib only, no
horovodlike import, so the tests do not depend on the core being built)."""

import hashlib
import hmac
import os
import socket


class RendezvousClient:
    def __init__(self, address: str, port: int, secret: str, timeout: float = 10.0):
        self._socket = socket.create_connection((address, port), timeout=timeout)
        self._reader = self._socket.makefile("rb")
        # The server greets with a nonce; both sides prove they know the secret (rendezvous.py).
        hello = self._reader.readline().decode().rstrip("\n")
        assert hello.startswith("HELLO "), hello
        server_nonce, client_nonce = bytes.fromhex(hello[6:]), os.urandom(32)

        def proof(role):
            return hmac.new(secret.encode(), server_nonce + client_nonce +
                            f"horovodlike rendezvous {role}".encode(), hashlib.sha256).hexdigest()
        reply = self.request(f"AUTH {client_nonce.hex()} {proof('client')}")
        if reply != f"OK {proof('server')}":
            raise RuntimeError(f"rendezvous refused AUTH: {reply}")

    @classmethod
    def from_env(cls) -> "RendezvousClient":
        return cls(os.environ["HOROVOD_RENDEZVOUS_ADDR"],
                   int(os.environ["HOROVOD_RENDEZVOUS_PORT"]),
                   os.environ["HOROVOD_SECRET_KEY"])

    def request(self, line: str) -> str:
        self._socket.sendall(line.encode() + b"\n")
        return self._reader.readline().decode().rstrip("\n")

    def put(self, key: str, value: str) -> str:
        return self.request(f"PUT {key} {value}")

    def get(self, key: str, timeout_ms: int) -> str:
        return self.request(f"GET {key} {timeout_ms}")

    def close(self) -> None:
        self._reader.close()
        self._socket.close()
