"""Does autotuning earn its keep? train_step.py's horovodlike job with HOROVOD_AUTOTUNE=1 beside
the same job at every hand-picked fusion threshold and cycle time of a grid, in the same run.

    python benchmarks/autotune.py --np 2 --thresholds 1,8,64 --cycles 1,5 --repeat 2

Each configuration is a train_step.py job through the launcher (`--fusion-threshold-mb`,
`--cycle-time-ms`, or `--autotune`), run in turns (--repeat rounds) so that the machine's load
hits them alike; the table gives the median samples/s over rounds and each one's ratio to the
best hand-picked configuration. The autotuned job gets --tune-steps more warm-up steps, enough
for its warm-up samples and its Bayesian samples (`--autotune-steps-per-sample`,
`--autotune-bayes-opt-max-samples` as given here), so that its timed windows run with the values
it settled on; the values it chose are printed beside it. The load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step  # noqa: E402
from provenance import footer, header, record  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--thresholds", default="1,8,64", help="fusion thresholds, MiB")
    parser.add_argument("--cycles", default="1,5", help="cycle times, ms")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps-per-sample", type=int, default=5)
    parser.add_argument("--max-samples", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()
    print(header(), flush=True)

    configs = {}
    for threshold in args.thresholds.split(","):
        for cycle in args.cycles.split(","):
            configs[f"fusion {threshold} MiB, cycle {cycle} ms"] = (
                ["--fusion-threshold-mb", threshold, "--cycle-time-ms", cycle], args.warmup)
    warmup_samples = 3
    tune_steps = (warmup_samples + args.max_samples + 1) * args.steps_per_sample
    configs["autotune"] = (["--autotune", "--autotune-warmup-samples", str(warmup_samples),
                            "--autotune-steps-per-sample", str(args.steps_per_sample),
                            "--autotune-bayes-opt-max-samples", str(args.max_samples)],
                           args.warmup + tune_steps)
    job_args = argparse.Namespace(np=args.np, timeout=args.timeout)
    per_round = {label: [] for label in configs}
    chosen = []
    loads = []
    for round_ in range(args.repeat):
        for label, (flags, warmup) in configs.items():
            worker_args = ["--batch-size", str(args.batch_size), "--steps", str(args.steps),
                           "--windows", str(args.windows), "--warmup", str(warmup)]
            loads.append(os.getloadavg()[0])
            start = time.time()
            result = train_step.run_job("horovodlike", job_args, worker_args, flags)
            per_round[label].append(statistics.median(result["rates"]))
            if label == "autotune":
                chosen.append(result["settings"])
            print(f"round {round_ + 1}/{args.repeat}: {label}: {per_round[label][-1]:.1f} "
                  f"samples/s ({time.time() - start:.0f} s, load {loads[-1]:.1f})", flush=True)

    table = {label: statistics.median(v) for label, v in per_round.items()}
    hand = {k: v for k, v in table.items() if k != "autotune"}
    best = max(hand, key=hand.get)
    print()
    print(f"train_step.py, {args.np} ranks, batch {args.batch_size} per rank, median samples/s "
          f"over {args.repeat} rounds; load average {min(loads):.1f}..{max(loads):.1f}")
    print()
    print("| configuration | samples/s | vs best hand-picked |")
    print("|---|---:|---:|")
    for label, rate in sorted(table.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {rate:.1f} | {rate / table[best]:.2f}x |")
    print()
    for i, settings in enumerate(chosen):
        print(f"autotune, round {i + 1}: settled on fusion threshold "
              f"{settings['fusion_threshold_bytes'] / 2**20:.1f} MiB, cycle time "
              f"{settings['cycle_time_ms']:.2f} ms, cache {'on' if settings['cache_enabled'] else 'off'}"
              f", tuning finished: {settings['autotune_done']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"provenance": record(), "np": args.np, "samples_per_s": table,
                       "per_round": per_round,
                       "best_hand_picked": best, "autotune_settings": chosen,
                       "load_average_at_starts": loads}, f, indent=1)
    print(footer(), flush=True)


if __name__ == "__main__":
    main()
