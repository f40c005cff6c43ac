"""A test rank: does what its flags say, in this order: init, record, join, print, fail, sleep."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rendezvous_client import RendezvousClient  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--record", help="write DIR/rank.<rank>.json: env, cwd, argv, pids")
parser.add_argument("--join", action="store_true", help="PUT addr/0/<rank> at the rendezvous")
parser.add_argument("--no-join-ranks", default="", help="comma-separated ranks that skip --join")
parser.add_argument("--lines", type=int, default=0, help="print this many numbered lines")
parser.add_argument("--long-line", type=int, default=0,
                    help="write one line of this many bytes in small flushed pieces")
parser.add_argument("--partial", help="finish stdout with this text and no newline")
parser.add_argument("--fail", help="RANK:CODE exit with CODE on RANK (after --fail-delay)")
parser.add_argument("--fail-delay", type=float, default=0.0)
parser.add_argument("--sigkill", type=int, help="this rank kills itself with SIGKILL")
parser.add_argument("--child", action="store_true", help="start a sleeping child process")
parser.add_argument("--init", action="store_true", help="horovodlike's init() (no framework)")
parser.add_argument("--ignore-term-ranks", default="", help="ranks that ignore SIGTERM")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("words", nargs="*")
args = parser.parse_args()

rank = int(os.environ["HOROVOD_RANK"])
child = None
if args.child:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
if str(rank) in args.ignore_term_ranks.split(","):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.init:
    from horovodlike.common import basics
    basics.init()
if args.record:
    record = {"env": {k: v for k, v in os.environ.items()
                      if k.startswith("HOROVOD_") or k in ("PYTHONUNBUFFERED", "PATH", "HOME",
                                                          "PYTHONPATH", "FROM_LAUNCHER")},
              "cwd": os.getcwd(), "words": args.words, "pid": os.getpid(),
              "child_pid": child.pid if child else None, "pgid": os.getpgrp()}
    path = os.path.join(args.record, f"rank.{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
if args.join and str(rank) not in args.no_join_ranks.split(","):
    client = RendezvousClient.from_env()
    assert client.put(f"addr/0/{rank}", f"{os.environ['HOROVOD_HOSTNAME']}:{os.getpid()}") == "OK"
    client.close()
for i in range(args.lines):
    print(f"line {i} of rank {rank}")
    print(f"err {i} of rank {rank}", file=sys.stderr)
if args.long_line:
    piece = str(rank) * 1000
    for _ in range(args.long_line // 1000):
        sys.stdout.write(piece)
        sys.stdout.flush()
        time.sleep(0.001)
    sys.stdout.write("\n")
if args.partial:
    sys.stdout.write(args.partial)
    sys.stdout.flush()
if args.fail:
    fail_rank, code = map(int, args.fail.split(":"))
    if rank == fail_rank:
        time.sleep(args.fail_delay)
        print(f"rank {rank} failing with {code}", file=sys.stderr)
        sys.exit(code)
if args.sigkill == rank:
    time.sleep(args.fail_delay)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(args.sleep)
