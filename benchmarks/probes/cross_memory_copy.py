"""Builds and runs cross_memory_copy.c (a copy of 64 MiB out of another process with
process_vm_readv, beside memcpy) for each chunk size, with the provenance header.

    python3 benchmarks/probes/cross_memory_copy.py > benchmarks/results/cross-memory-copy.txt
"""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from provenance import footer, header  # noqa: E402

CHUNKS_KIB = (64, 256, 1024, 8192)


def main():
    print(header(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, "cross_memory_copy")
        subprocess.run(["cc", "-O2", os.path.join(HERE, "cross_memory_copy.c"), "-o", binary],
                       check=True)
        for chunk in CHUNKS_KIB:
            print(f"\nchunks of {chunk} KiB", flush=True)
            subprocess.run([binary, str(chunk), "5"], check=True)
    print(footer(), flush=True)


if __name__ == "__main__":
    main()
