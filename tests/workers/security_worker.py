"""Strangers on the ports a job listens on. Writes argv[2]/rank<r>.json.

attack-listener  rank 0 waits in init() for rank 1; rank 1 first reads rank 0's address from the
                 rendezvous server and attacks rank 0's listening port: random bytes, 1 MB of
                 garbage, a truncated handshake, a wrong magic, a claim to be rank 5, a claim to
                 be rank 1 with a wrong proof (after checking that rank 0 proves itself with the
                 right HMAC), and a connection that says nothing and stays open. Then rank 1
                 joins for real and both check allreduce results.
fake-listener    rank 0 does not init: it publishes its own address as rank 0's and answers rank
                 1's handshake with a wrong proof; rank 1's init() must refuse it, and rank 0
                 must have received nothing but the 44-byte Hello.
steady           both ranks run allreduces, checking every result, until the file argv[3]
                 exists (the test attacks the rendezvous server meanwhile, then creates it).
"""

import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "helpers"))
from rendezvous_client import RendezvousClient  # noqa: E402

from horovodlike.common import basics  # noqa: E402
from horovodlike.common import numpy_ops as ops  # noqa: E402
from horovodlike.common.exceptions import HorovodInternalError  # noqa: E402

mode, report_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ["HOROVOD_RANK"])
secret = os.environ["HOROVOD_SECRET_KEY"]
MAGIC = 0x324C5648  # "HVL2"
ACCEPT = 0x4B4F5648


def report(**fields):
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as f:
        json.dump(fields, f)


def proof(role, generation, frm, to, first_nonce, second_nonce):
    context = f"horovodlike peer {role} generation {generation} from rank {frm} to rank {to}"
    return hmac.new(secret.encode(), first_nonce + second_nonce + context.encode(),
                    hashlib.sha256).digest()


def check_allreduce(name, count):
    out = ops.allreduce(np.arange(count, dtype=np.float64) * (rank + 1), name, op=ops.Sum)
    expected = np.arange(count, dtype=np.float64) * 3
    assert np.array_equal(out, expected), (name, out[:4])


def address_of(peer):
    client = RendezvousClient.from_env()
    value = client.get(f"addr/0/{peer}", 30000)
    client.close()
    assert value.startswith("VALUE "), value
    host, port = value[len("VALUE "):].rsplit(":", 1)
    return host, int(port)


def closed_by_peer(sock, timeout=5.0):
    """True when the other side closes the connection (or resets it) within the timeout."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


if mode == "attack-listener":
    if rank == 0:
        basics.init()
    else:
        target = address_of(0)
        seen = {}
        rng = np.random.default_rng(1)
        for name, payload in [("random", rng.bytes(4096)), ("oversized", rng.bytes(1 << 20)),
                              ("truncated", struct.pack("<Ii", MAGIC, 1)),
                              ("wrong magic", struct.pack("<Iii", 0xDEADBEEF, 1, 0) + bytes(32)),
                              ("rank 5", struct.pack("<Iii", MAGIC, 5, 0) + bytes(32))]:
            with socket.create_connection(target, timeout=5) as s:
                try:
                    s.sendall(payload)
                    if name == "truncated":
                        s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass  # closed on us while we were still sending: also a rejection
                seen[name] = closed_by_peer(s)
        # The right header and a wrong proof: rank 0 proves itself first (with the real HMAC),
        # then drops us without accepting.
        with socket.create_connection(target, timeout=5) as s:
            nonce = os.urandom(32)
            s.sendall(struct.pack("<Iii", MAGIC, 1, 0) + nonce)
            challenge = b""
            while len(challenge) < 72:
                challenge += s.recv(72 - len(challenge))
            magic, their_rank = struct.unpack("<Ii", challenge[:8])
            their_nonce, their_proof = challenge[8:40], challenge[40:72]
            seen["listener proof"] = (magic == MAGIC and their_rank == 0 and hmac.compare_digest(
                their_proof, proof("listener", 0, 0, 1, nonce, their_nonce)))
            s.sendall(os.urandom(32))
            seen["wrong proof"] = closed_by_peer(s)
        silent = socket.create_connection(target, timeout=5)  # says nothing, stays open
        started = time.time()
        basics.init()
        seen["init seconds"] = time.time() - started
        silent.close()
    check_allreduce("small", 10)
    check_allreduce("large", 1 << 20)
    report(outcome="ok", seen=seen if rank == 1 else {})

elif mode == "fake-listener":
    if rank == 0:
        listener = socket.create_server(("127.0.0.1", 0))
        client = RendezvousClient.from_env()
        assert client.put("addr/0/0", f"127.0.0.1:{listener.getsockname()[1]}") == "OK"
        listener.settimeout(30)
        connection, _ = listener.accept()
        received = b""
        connection.settimeout(3)
        while len(received) < 44:
            received += connection.recv(44 - len(received))
        connection.sendall(struct.pack("<Ii", MAGIC, 0) + os.urandom(64))  # a wrong proof
        try:
            while True:
                more = connection.recv(65536)
                if not more:
                    break
                received += more
        except (socket.timeout, ConnectionResetError):
            pass
        report(received=len(received), secret_seen=secret.encode() in received or
               bytes.fromhex(secret) in received)
    else:
        try:
            basics.init()
            report(outcome="init returned")
        except HorovodInternalError as e:
            report(outcome="HorovodInternalError", message=str(e))

elif mode == "steady":
    basics.init()
    stop = sys.argv[3]
    steps = 0
    # Rank 0 decides when to stop, so that both ranks make the same calls.
    while steps < 20 or ops.broadcast(np.array([not os.path.exists(stop)]), 0, "go")[0]:
        check_allreduce(f"t{steps % 7}", 1000 + steps % 3)
        steps += 1
    report(outcome="ok", steps=steps)
