"""benchmarks/wire_bytes.py, which the model-parallel benchmarks use to report the bytes a rank
really sent: a loopback connection's payload is counted exactly, other sockets not at all."""

import socket
import sys
import threading

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from wire_bytes import tcp_bytes_sent  # noqa: E402


def test_counts_the_payload_this_process_sent_over_tcp():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    left, right = socket.socketpair()  # not TCP: never counted
    payload = 3_000_001

    def drain():
        got = 0
        while got < payload:
            got += len(peer.recv(1 << 20))
    reader = threading.Thread(target=drain)
    before = tcp_bytes_sent()
    reader.start()
    client.sendall(b"x" * payload)
    left.sendall(b"y" * 1000)
    reader.join()
    peer.sendall(b"z" * 10)
    assert tcp_bytes_sent() - before == payload + 10
    for s in (client, peer, server, left, right):
        s.close()
