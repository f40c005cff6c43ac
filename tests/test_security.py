"""Security: SHA-256 and HMAC-SHA256 against the published vectors; the control-message decoders
fuzzed (atheris) and mutated; strangers on a rank's listening port and on the rendezvous server
while a job runs (rejected, and the job's results still right); an impostor listening at a
rank's address learns nothing; the rendezvous server binds only the interface in use."""

import os
import random
import re
import socket
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, WORKERS, job_env

from horovodlike import _core
from horovodlike._core import _testing
from horovodlike.runner import launch as launcher
from horovodlike.runner.rendezvous import answer_hello

# ------------------------------------------------------------------------- SHA-256, HMAC

SHA256_VECTORS = [  # FIPS 180-4 examples
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]

RFC4231 = [  # (key, data, HMAC-SHA-256; test case 5 is truncated to 128 bits)
    (b"\x0b" * 20, b"Hi There",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50,
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50,
     "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (b"\x0c" * 20, b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger than "
     b"block-size data. The key needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]


def test_sha256_and_hmac_match_the_published_vectors():
    for data, digest in SHA256_VECTORS:
        assert _testing.sha256(data).hex() == digest
    for key, data, mac in RFC4231:
        assert _testing.hmac_sha256(key, data).hex()[:len(mac)] == mac
    # Every length around the 64-byte block and its padding boundary, against hashlib.
    import hashlib
    import hmac
    for n in range(0, 200):
        data = bytes(i % 251 for i in range(n))
        assert _testing.sha256(data) == hashlib.sha256(data).digest(), n
        assert _testing.hmac_sha256(data, data[::-1]) == \
            hmac.new(data, data[::-1], hashlib.sha256).digest(), n


# ------------------------------------------------------------------------- message decoders

def _string(s: bytes) -> bytes:
    return struct.pack("<q", len(s)) + s


def _int64s(values) -> bytes:
    return struct.pack(f"<q{len(values)}q", len(values), *values)


# The codes come from the extension (no second copy of its tables); the layout is written here.
OP = _core.OPS
DTYPE = _core.DTYPES
REDUCE = _core.REDUCE_OPS
CONTROL_OPS = (OP["join"], OP["add_process_set"], OP["remove_process_set"])
CONTROL_RESPONSES = CONTROL_OPS  # responses number their types as the ops...
ERROR_RESPONSE = len(OP)         # ...followed by the error response (core/message.h)


def encode_requests(requests) -> bytes:
    """The core's request list format (csrc/core/message.cc), written independently: a common
    header, then a collective's tensor fields or a control operation's own record."""
    out = struct.pack("<q", len(requests))
    for r in requests:
        out += struct.pack("<ii", r["rank"], r["op"]) + _string(r["name"])
        if r["op"] in CONTROL_OPS:
            out += _int64s(r["ranks"]) + struct.pack("<i", r["set_id"])
            continue
        out += struct.pack("<i", r["dtype"]) + _int64s(r["shape"])
        out += struct.pack("<iddii", r["reduce"], r["prescale"], r["postscale"], r["root"], -1)
        out += _int64s(r["splits"]) + struct.pack("<qi", r["group"], r["group_size"])
    return out


def encode_responses(responses) -> bytes:
    out = struct.pack("<q", len(responses))
    for r in responses:
        out += struct.pack("<iq", r["type"], len(r["names"]))
        out += b"".join(_string(n) for n in r["names"])
        if r["type"] in CONTROL_RESPONSES:
            out += _int64s(r["ranks"]) + struct.pack("<ii", r["set_id"], r["last_joined"])
            continue
        out += struct.pack("<iiddii", DTYPE["float32"], REDUCE["Sum"], 1.0, 0.5, 0, -1)
        out += _int64s(r["first_dims"]) + _int64s(r.get("alltoall_rows", []))
        out += _int64s(r["shape"]) + _int64s(r["sizes"])
        out += struct.pack("<qqi", r["bytes"], 0, 0) + _string(r["error"])
    return out


SEED_REQUESTS = [
    encode_requests([]),
    encode_requests([dict(rank=1, op=OP["allreduce"], name=b"grad.w", dtype=DTYPE["float32"],
                          shape=[3, 4], reduce=REDUCE["Average"], prescale=1.0, postscale=0.5,
                          root=0, splits=[], group=0, group_size=0)]),
    encode_requests([dict(rank=0, op=OP["alltoall"], name=b"a2a", dtype=DTYPE["int64"],
                          shape=[6], reduce=REDUCE["Sum"], prescale=1.0, postscale=1.0, root=0,
                          splits=[2, 4], group=9, group_size=2),
                     dict(rank=0, op=OP["broadcast"], name=b"b" * 40, dtype=DTYPE["bool"],
                          shape=[], reduce=REDUCE["Sum"], prescale=1.0, postscale=1.0, root=1,
                          splits=[], group=0, group_size=0)]),
    # Control operations: their own record, no tensor fields.
    encode_requests([dict(rank=1, op=OP["add_process_set"], name=b"process_set.add.0-2",
                          ranks=[0, 2], set_id=-1),
                     dict(rank=1, op=OP["remove_process_set"], name=b"process_set.remove.3",
                          ranks=[], set_id=3),
                     dict(rank=1, op=OP["join"], name=b"join", ranks=[], set_id=-1)]),
]
SEED_RESPONSES = [
    encode_responses([]),
    encode_responses([dict(type=OP["allreduce"], names=[b"x", b"y"], first_dims=[], shape=[2],
                           sizes=[2, 5], bytes=28, error=b""),
                      dict(type=ERROR_RESPONSE, names=[b"bad"], first_dims=[1, 2], shape=[],
                           sizes=[], bytes=0, error=b"Mismatched shapes")]),
    encode_responses([dict(type=OP["add_process_set"], names=[b"process_set.add.0-2"],
                           ranks=[0, 2], set_id=-1, last_joined=-1),
                      dict(type=OP["join"], names=[b"join"], ranks=[], set_id=-1,
                           last_joined=1),
                      dict(type=OP["alltoall"], names=[b"a2a"], first_dims=[],
                           alltoall_rows=[1, 2, 3, 4], shape=[3], sizes=[], bytes=0,
                           error=b"")]),
]


def test_decoders_round_trip_valid_messages():
    for seed in SEED_REQUESTS:
        assert _testing.decode_requests(seed) == seed
    for seed in SEED_RESPONSES:
        assert _testing.decode_responses(seed) == seed


def test_alltoall_split_matrix_of_more_than_1024_ranks_decodes():
    # The matrix of rows rank i sends to rank j has size^2 entries: over a million here.
    n = 1025
    message = encode_responses([dict(type=OP["alltoall"], names=[b"a2a"], first_dims=[],
                                     alltoall_rows=[1] * (n * n), shape=[n], sizes=[], bytes=0,
                                     error=b"")])
    assert _testing.decode_responses(message) == message
    # A length beyond the bytes that follow is still refused before anything is allocated.
    truncated = message[:-200]
    with pytest.raises(ValueError, match="truncated"):
        _testing.decode_responses(truncated)


def test_decoders_refuse_what_enqueue_refuses():
    # A name over MAX_NAME_BYTES and a process set with a negative rank raise on the caller
    # (tests/workers/input_checks_worker.py); from the wire they stay malformed messages.
    def allreduce(name):
        return encode_requests([dict(rank=1, op=OP["allreduce"], name=name, dtype=DTYPE["int8"],
                                     shape=[1], reduce=REDUCE["Sum"], prescale=1.0,
                                     postscale=1.0, root=0, splits=[], group=0, group_size=0)])
    longest = allreduce(b"n" * _core.MAX_NAME_BYTES)
    assert _testing.decode_requests(longest) == longest
    with pytest.raises(ValueError, match="bad string length"):
        _testing.decode_requests(allreduce(b"n" * (_core.MAX_NAME_BYTES + 1)))
    negative = encode_requests([dict(rank=1, op=OP["add_process_set"], name=b"add", ranks=[-1, 0],
                                     set_id=-1)])
    with pytest.raises(ValueError, match="bad rank"):
        _testing.decode_requests(negative)


def _check(data: bytes) -> None:
    """The property fuzzed: either ValueError, or the message re-encodes to the same bytes."""
    for decode in (_testing.decode_requests, _testing.decode_responses):
        try:
            out = decode(data)
        except ValueError:
            continue
        assert out == data, data


def test_decoders_reject_mutated_and_hostile_messages():
    rng = random.Random(4231)
    hostile = [b"", b"\x00" * 7, struct.pack("<q", -1), struct.pack("<q", 1 << 62),
               struct.pack("<q", 1) + struct.pack("<ii", 0, 0) + struct.pack("<q", 1 << 40),
               struct.pack("<q", 1) + struct.pack("<iq", 0, 1 << 30)]
    for data in hostile:
        _check(data)
    seeds = SEED_REQUESTS + SEED_RESPONSES
    for _ in range(20000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.4 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif choice < 0.6 and data:
                at = rng.randrange(len(data))
                del data[at:at + rng.randint(1, 16)]
            elif choice < 0.8:
                at = rng.randrange(len(data) + 1)
                data[at:at] = rng.randbytes(rng.randint(1, 16))
            elif len(data) >= 8:
                at = rng.randrange(len(data) - 7)
                data[at:at + 8] = struct.pack("<q", rng.choice([-1, 0, 1 << 20, 1 << 31,
                                                                (1 << 63) - 1]))
        _check(bytes(data))


def test_decoders_under_atheris(tmp_path):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(SEED_REQUESTS + SEED_RESPONSES):
        (corpus / f"seed{i}").write_bytes(seed)
    script = tmp_path / "fuzz.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import atheris
        from horovodlike._core import _testing

        @atheris.instrument_func
        def check(data):  # as _check in test_security.py
            for decode in (_testing.decode_requests,
                           _testing.decode_responses):
                try:
                    out = decode(data)
                except ValueError:
                    continue
                assert out == data, data

        atheris.Setup([sys.argv[0], "-runs=100000", "-max_total_time=20", "-max_len=2048",
                       "-seed=4231", {str(corpus)!r}], check)
        atheris.Fuzz()
    """))
    result = subprocess.run([sys.executable, str(script)], env=job_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.search(r"Done \d+ runs", result.stderr), result.stderr[-2000:]


# ------------------------------------------------------------------------- live jobs

def run_worker(np, mode, directory, *args, env=None, timeout=240):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np),
               sys.executable, str(WORKERS / "security_worker.py"), mode, str(directory),
               *map(str, args)]
    return subprocess.run(command, env=env or job_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def read_report(directory, rank):
    import json
    return json.loads((directory / f"rank{rank}.json").read_text())


def test_strangers_on_a_ranks_listening_port_are_rejected(tmp_path):
    result = run_worker(2, "attack-listener", tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    seen = read_report(tmp_path, 1)["seen"]
    assert seen.pop("listener proof") is True  # rank 0 answered with the real HMAC
    init_seconds = seen.pop("init seconds")
    assert init_seconds < 10  # the silent connection held no one up
    assert seen == {name: True for name in ("random", "oversized", "truncated", "wrong magic",
                                            "rank 5", "wrong proof")}, seen
    assert read_report(tmp_path, 0)["outcome"] == "ok"
    rejected = [line for line in result.stderr.splitlines()
                if line.startswith("[0]<stderr>:") and "rejected a connection from" in line]
    assert len(rejected) >= 5, result.stderr
    assert any("does not know this job's secret" in line for line in rejected), rejected


def test_an_impostor_at_a_ranks_address_learns_nothing(tmp_path):
    result = run_worker(2, "fake-listener", tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    dialer = read_report(tmp_path, 1)
    assert dialer["outcome"] == "HorovodInternalError", dialer
    assert "did not prove that it knows this job's secret" in dialer["message"], dialer
    impostor = read_report(tmp_path, 0)
    assert impostor == {"received": 44, "secret_seen": False}, impostor


class _Attacker:
    """Connections to the rendezvous server that must all be refused."""

    def __init__(self, port):
        self.port = port

    def connect(self):
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        return sock, sock.makefile("rb")

    def refused(self, payload_for_hello):
        sock, reader = self.connect()
        with sock:
            hello = reader.readline().decode().rstrip("\n")
            try:
                sock.sendall(payload_for_hello(hello))
                reply = reader.readline()
                rest = reader.read()
            except OSError:
                return True  # reset: refused
            return not reply.startswith(b"OK") and rest in (b"", b"ERROR line too long\n")


def test_strangers_on_the_rendezvous_server_while_a_job_runs(tmp_path):
    launcher_process = subprocess.Popen(
        [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2", "--verbose",
         sys.executable, str(WORKERS / "security_worker.py"), "steady", str(tmp_path),
         str(tmp_path / "stop")],
        env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        first = launcher_process.stdout.readline()
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+);", first).group(1))
        attacker = _Attacker(port)
        wrong_key = "00" * 32
        outcomes = {
            "random bytes": attacker.refused(lambda hello: os.urandom(3000) + b"\n"),
            "old protocol, secret guessed": attacker.refused(lambda hello: b"AUTH " +
                                                             b"ab" * 32 + b"\n"),
            "right header, wrong key": attacker.refused(
                lambda hello: answer_hello(wrong_key, hello)[0].encode() + b"\n"),
            "right header, wrong HMAC": attacker.refused(
                lambda hello: b"AUTH " + b"11" * 32 + b" " + b"22" * 32 + b"\n"),
            "oversized line": attacker.refused(lambda hello: b"PUT " + b"x" * 100_000),
            "binary garbage": attacker.refused(lambda hello: bytes(range(256)) * 8),
        }
        # A truncated line and then silence, and a crowd of idle connections, while the job
        # goes on.
        idle = [attacker.connect() for _ in range(20)]
        idle[0][0].sendall(b"AUTH 12")
        time.sleep(1)  # the job goes on beside them a while (it runs until told to stop)
        (tmp_path / "stop").touch()
        stdout, stderr = launcher_process.communicate(timeout=240)
        for sock, reader in idle:
            sock.close()
    finally:
        if launcher_process.poll() is None:
            launcher_process.kill()
            launcher_process.communicate()
    assert outcomes == {name: True for name in outcomes}, outcomes
    assert launcher_process.returncode == 0, (stdout + stderr)[-4000:]
    for rank in (0, 1):
        report = read_report(tmp_path, rank)
        assert report["outcome"] == "ok" and report["steps"] >= 20, report


def test_rendezvous_server_binds_only_the_interface_in_use():
    class Parser:
        def error(self, message):
            raise AssertionError(message)
    assert launcher._rendezvous_addresses(True, None, Parser()) == ("127.0.0.1", "127.0.0.1")
    bind, connect = launcher._rendezvous_addresses(False, None, Parser())
    assert bind == connect and bind != "0.0.0.0"
    assert launcher._rendezvous_addresses(False, "lo", Parser()) == ("127.0.0.1", "127.0.0.1")
