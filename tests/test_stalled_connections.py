"""Strangers who connect and then say nothing, by the thousand, while a job starts: rank 0's peer
listener and the launcher's rendezvous server go on serving the real ranks at once, with fewer
file descriptors than strangers, and the job's results are right."""

import json
import os
import resource
import socket
import subprocess
import sys
import threading

from conftest import REPO, WORKERS, job_env

from horovodlike.runner.rendezvous import RendezvousServer

CROWD = 1000  # silent connections on each of the two ports
# The launcher's and the ranks' soft limit on open files: half the crowd, so that a server that
# keeps every silent connection runs out of descriptors before a rank gets in.
FILE_LIMIT = 512


def limit_open_files():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = FILE_LIMIT if hard == resource.RLIM_INFINITY else min(FILE_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_crowd_of_silent_connections_does_not_hold_up_init(tmp_path):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2",
               "--start-timeout", "60", sys.executable, str(WORKERS / "crowded_init_worker.py"),
               str(tmp_path), str(CROWD)]
    result = subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=240,
                            cwd=REPO, preexec_fn=limit_open_files)
    output = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, output
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert reports[0]["outcome"] == "ok", reports
    crowded = reports[1]
    # The whole crowd was established (the servers' listen queues took it) before rank 1's
    # init() began; the helper held it open through init() and the allreduces.
    assert crowded["connected"] == [CROWD, CROWD], crowded
    # Not held up: a server that waited on the silent ones would take their auth timeout
    # (10 s) or run out of descriptors; the margin below it is for a busy machine, where the
    # servers' work on the crowd competes for a core.
    baseline, attacked = crowded["init seconds 1"], crowded["init seconds 2"]
    assert attacked < baseline + 5.0, crowded
    # Silent connections beyond what the servers keep pending were dropped, not left to pile
    # up against the file-descriptor limit: rank 0 never had half its descriptors open.
    assert all(closed > 0 for closed in crowded["closed by server"]), crowded
    assert reports[0]["open files 2"] < FILE_LIMIT // 2, reports[0]


class DropsFirstConnection:
    """Stands in front of a server. The first connection gets `greeting` and is closed
    unanswered, as a listener closes the connection silent longest when a crowd has taken every
    handshake slot; the others are relayed to the server at `upstream` (host, port)."""

    def __init__(self, upstream, greeting=b""):
        self._upstream, self._greeting = upstream, greeting
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            if self.connections == 1:
                connection.sendall(self._greeting)
                connection.close()
                continue
            upstream = socket.create_connection(self._upstream)
            for source, sink in ((connection, upstream), (upstream, connection)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    @staticmethod
    def _relay(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        self._listener.close()


SECRET = "5e" * 32


def rank_env(rank, size, rendezvous_port):
    return job_env({"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
                    "HOROVOD_LOCAL_RANK": str(rank), "HOROVOD_LOCAL_SIZE": str(size),
                    "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
                    "HOROVOD_HOSTNAME": "localhost", "HOROVOD_SECRET_KEY": SECRET,
                    "HOROVOD_RENDEZVOUS_ADDR": "127.0.0.1",
                    "HOROVOD_RENDEZVOUS_PORT": str(rendezvous_port),
                    # Room for the ranks' start-up on a busy machine; the tests are about
                    # connecting again, not about the timeout.
                    "HOROVOD_START_TIMEOUT": "60"})


def test_a_rank_dropped_before_the_rendezvous_answers_connects_again():
    server = RendezvousServer(SECRET)
    server.start()
    proxy = DropsFirstConnection(("127.0.0.1", server.port),
                                 f"HELLO {os.urandom(32).hex()}\n".encode())
    try:
        result = subprocess.run(
            [sys.executable, "-c", "from horovodlike.common import basics; basics.init()"],
            env=rank_env(0, 1, proxy.address.rsplit(":", 1)[1]), capture_output=True,
            text=True, timeout=120, cwd=REPO)
    finally:
        proxy.close()
        server.stop()
    assert result.returncode == 0, result.stderr[-4000:]
    assert proxy.connections == 2
    assert server.get("addr/0/0") == "single"  # a one-rank job's sign that it joined


class ReroutingRank0(RendezvousServer):
    """Publishes a DropsFirstConnection in front of rank 0's listener as rank 0's address."""

    proxy = None

    def put(self, key, value):
        if key == "addr/0/0":
            host, port = value.rsplit(":", 1)
            self.proxy = DropsFirstConnection((host, int(port)))
            value = self.proxy.address
        super().put(key, value)


RANK_SCRIPT = """
import numpy as np
from horovodlike.common import basics
from horovodlike.common import numpy_ops as ops
basics.init()
out = ops.allreduce(np.arange(5.0) * (basics.rank() + 1), "x", op=ops.Sum)
assert np.array_equal(out, np.arange(5.0) * 3), out
basics.shutdown()
"""


def test_a_rank_dropped_before_its_peer_answers_dials_again():
    server = ReroutingRank0(SECRET)
    server.start()
    ranks = []
    try:
        for rank in (0, 1):
            ranks.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], cwd=REPO,
                                          env=rank_env(rank, 2, server.port), text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
        if server.proxy is not None:
            server.proxy.close()
        server.stop()
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    # The dropped dial, the stream dialled again, then the tagged channel (links/README.md:
    # two sockets per peer in the one mesh).
    assert server.proxy.connections == 3, outputs
