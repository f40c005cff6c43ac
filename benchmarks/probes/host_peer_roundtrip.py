"""Point-to-point round trips between two ranks of one host, in a job of 4 ranks on one host
and in one of 2 emulated hosts x 2 ranks (planner.py's run_job: network namespaces, a 1 Gbit/s
link), where a rank waits for its host peer and for TCP peers at once; beside it the round
trip between ranks on different hosts. Each job does 300 round trips of a 16-byte tensor per
pair; --rounds jobs of each, the builds in turns (--before: another build's src folder, run
first in each round). Needs root for the emulated hosts.

    python3 benchmarks/probes/host_peer_roundtrip.py --before ../hvdl-before/src --rounds 5 \\
        > benchmarks/results/host-peer-roundtrip.txt
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from provenance import footer, header  # noqa: E402

TRIPS = 300


def worker(out):
    import torch
    import horovodlike.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    t = torch.zeros(4)

    def roundtrips(a, b):
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(TRIPS):
            if rank == a:
                hvd.send(t, b, tag=1)
                hvd.recv(t, b, tag=2)
            elif rank == b:
                hvd.recv(t, a, tag=1)
                hvd.send(t, a, tag=2)
        return (time.perf_counter() - start) / TRIPS * 1e6
    same = roundtrips(0, 1)          # ranks 0 and 1 share a host in both setups
    across = roundtrips(0, size - 1)  # rank 3: the other host (or the same one)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"same_host_us": same, "other_rank_us": across}, f)
    hvd.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another build's src folder, run in turns with this one")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    from planner import run_job
    print(header(), flush=True)
    builds = ([("before", os.path.abspath(args.before))] if args.before else []) + [("this", None)]
    caller_path = os.environ.get("PYTHONPATH")
    results = {}
    for round_ in range(1, args.rounds + 1):
        for name, source in builds:
            for setup in ("one-host", "two-hosts"):
                if source:
                    os.environ["PYTHONPATH"] = source
                elif caller_path is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = caller_path
                with tempfile.TemporaryDirectory() as tmp:
                    out = os.path.join(tmp, "result.json")
                    run_job([os.path.abspath(__file__), "--worker", out], setup, "1gbit", 300)
                    with open(out) as f:
                        one = json.load(f)
                results.setdefault((name, setup), []).append(one)
                print(f"round {round_}: {name:6} {setup:9}: ranks of one host "
                      f"{one['same_host_us']:8.1f} us, ranks 0 and 3 "
                      f"{one['other_rank_us']:8.1f} us", flush=True)
    print("\nmedian round trip over the rounds (all rounds above)")
    for (name, setup), ones in results.items():
        print(f"  {name:6} {setup:9}: ranks of one host "
              f"{statistics.median(o['same_host_us'] for o in ones):8.1f} us, ranks 0 and 3 "
              f"{statistics.median(o['other_rank_us'] for o in ones):8.1f} us")
    print(footer())


if __name__ == "__main__":
    main()
