"""The rendezvous handshake, both sides (runner/rendezvous.py documents the protocol): the
client's answer to the server's greeting and the server's check of it. Mutual HMAC proofs, the
secret itself never sent. Below both the launcher's server (runner/) and the ranks' client
(common/rendezvous_client.py), which share it."""

from __future__ import annotations

import hashlib
import hmac
import secrets

NONCE_BYTES = 32
_CLIENT_CONTEXT = b"horovodlike rendezvous client"
_SERVER_CONTEXT = b"horovodlike rendezvous server"


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


def fields_of(line: bytes) -> list[str] | None:
    """The space-separated fields of a line, or None when it is not well-formed ASCII text."""
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        return None
    fields = text.split(" ")
    if any(not field or not field.isprintable() for field in fields):
        return None
    return fields


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


def check_auth(secret: str, server_nonce: bytes, line: bytes) -> str | None:
    """The server's side: the reply to a client's AUTH line ("OK <server proof>"), or None
    when the line does not prove that the client knows the secret."""
    fields = fields_of(line)
    client_nonce = _nonce(fields[1]) if fields and len(fields) == 3 else None
    if (client_nonce is None or fields[0] != "AUTH" or not hmac.compare_digest(
            fields[2].encode("ascii"),
            _proof(secret, server_nonce, client_nonce, _CLIENT_CONTEXT).encode("ascii"))):
        return None
    return f"OK {_proof(secret, server_nonce, client_nonce, _SERVER_CONTEXT)}"
