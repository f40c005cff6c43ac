"""Builds and runs slot_stores.c (64 MiB streamed between two processes through 1 MiB slots,
written with ordinary or streaming stores, with the CPUs' round trip before each round) for
ROUNDS rounds, with the provenance header, then the median of each way by the round trip.

    python3 benchmarks/probes/slot_stores.py > benchmarks/results/slot-stores-probe.txt
"""

import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from provenance import footer, header  # noqa: E402

ROUNDS = 1500
FAR_NS = 300   # a round trip above this: the two CPUs share no cache


def main():
    print(header(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, "slot_stores")
        subprocess.run(["cc", "-O2", "-mavx2", os.path.join(HERE, "slot_stores.c"), "-o",
                        binary], check=True)
        out = subprocess.run([binary, "1024", str(ROUNDS)], check=True, capture_output=True,
                             text=True).stdout
    print(out, end="", flush=True)
    rows = [line.split() for line in out.splitlines() if line.startswith("rt")]
    phases = {"round trip up to %d ns" % FAR_NS: [r for r in rows if float(r[1]) <= FAR_NS],
              "round trip over %d ns" % FAR_NS: [r for r in rows if float(r[1]) > FAR_NS]}
    print("\nmedian ms per 64 MiB each way, by the round trip before the round")
    for name, chosen in phases.items():
        if not chosen:
            print(f"{name}: no round")
            continue
        ordinary = statistics.median(float(r[4]) for r in chosen)
        streaming = statistics.median(float(r[7]) for r in chosen)
        print(f"{name}: {len(chosen)} rounds, ordinary stores {ordinary:.2f} ms, streaming "
              f"stores {streaming:.2f} ms")
    print(footer(), flush=True)


if __name__ == "__main__":
    main()
