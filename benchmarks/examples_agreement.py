"""How closely 2 ranks follow 1 process on the examples (docs/getting-started.md):

    python benchmarks/examples_agreement.py --out benchmarks/results/examples-agreement.json

runs examples/pytorch_digits.py (1 and 20 epochs) and examples/keras_digits.py (20 epochs, with
and without the warm-up) as `-np 1 --batch-size 32` and `-np 2 --batch-size 16`, and records the
largest difference of any final weight and each run's last output line (its accuracy)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [("pytorch_digits.py", ["--epochs", "1"]), ("pytorch_digits.py", ["--epochs", "20"]),
         ("keras_digits.py", ["--warmup-epochs", "0"]), ("keras_digits.py", [])]


def run(script, extra, np_, batch, path):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np_), sys.executable,
               os.path.join(REPO, "examples", script), "--batch-size", str(batch), *extra,
               "--save-weights", path]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for script, extra in CASES:
            load = [round(x, 2) for x in os.getloadavg()]
            one, two = (os.path.join(scratch, f"{n}.npz") for n in ("np1", "np2"))
            last1 = run(script, extra, 1, 32, one)
            last2 = run(script, extra, 2, 16, two)
            a, b = np.load(one), np.load(two)
            diff = max(float(np.abs(a[k] - b[k]).max()) for k in a.files)
            rows.append({"example": script, "flags": extra, "load_before": load,
                         "max_weight_difference": diff, "np1_last_line": last1,
                         "np2_last_line": last2})
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"command": "python benchmarks/examples_agreement.py --out " + args.out,
                   "commit": commit, "cpus": os.cpu_count(), "runs": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
