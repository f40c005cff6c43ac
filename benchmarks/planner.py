"""Is the planner right? Its predicted step time of every layout against the measured one.

    python benchmarks/planner.py --json benchmarks/results/planner.json   # needs root for
                                                                          # the emulated hosts

Two models (planner_models.py: an MLP and a small transformer) on 4 ranks, in two setups:
"one-host" (4 ranks of this machine, shared memory between them) and "two-hosts" (2 emulated
hosts x 2 ranks, multihost.py's network namespaces joined by a link shaped to --rate with tc
tbf; with --own-cores each host's ranks run on a share of this machine's cores of their own,
as real hosts' do, instead of all ranks on all of them). A job runs --rounds rounds; in each, for each model, every rank first runs
``hvd.calibrate`` (each layer profiled on every input size the layouts give a rank; an
alpha-beta line per link from the core's allreduce; how the ranks share the cores), then
``hvd.plan`` with that calibration; then every candidate layout (replicated data parallel:
DistributedOptimizer over dp, Megatron's column/row Linears over tp, Schedule1F1B on the
planner's stage split and micro-batches over pp) is trained for --steps timed steps after 3
warm-up ones, the layouts in an order rotated by one every round. Each round is a trial of its
own: its predictions come from its own calibration, taken minutes before, so a machine whose
speed drifts over the run (a shared virtual machine's does) judges the model, not the drift.
Prints each layout's prediction and measured median step in every round, their ratio, both
rankings, every step, the load around each job, and the verdict over every round.
"""

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planner_models import MODELS, build_model, measure, median  # noqa: E402
from provenance import footer, header, record  # noqa: E402
from source_tree import jobs_pythonpath  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUPS = ("one-host", "two-hosts", "one-host-tcp")   # the last: HOROVOD_SHM_DISABLE=1


def worker(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    results = {name: {"rounds": []} for name in args.models.split(",")}
    for round_ in range(args.rounds):
        for name in results:
            model, sample = build_model(name)
            calibration = hvd.calibrate(model, sample)
            result = hvd.plan(model, sample, world_size=hvd.size(), calibration=calibration,
                              fsdp=False, verbose=hvd.rank() == 0 and round_ == 0)
            target = torch.randn_like(model(sample))
            # The layouts in turn, the first one later by one place every round: no layout
            # always follows the same one.
            turn = round_ % len(result.candidates)
            measured = {}
            for c in result.candidates[turn:] + result.candidates[:turn]:
                tag = f"{name}.{c.pp}x{c.dp}x{c.tp}"  # tensor names take no spaces
                measured[c.layout] = measure(c, lambda tp_set: build_model(name, tp_set)[0],
                                             sample, target, args.steps, tag)
            results[name]["rounds"].append({
                "candidates": [dataclasses.asdict(c) for c in result.candidates],
                "measured_s": measured,
                "calibration": {"links": {k: dataclasses.asdict(v)
                                          for k, v in calibration.links.items()},
                                "layers": [dataclasses.asdict(p) for p in calibration.layers],
                                "conditions": calibration.conditions,
                                "world_size": calibration.world_size,
                                "batch": calibration.batch,
                                "slots_per_host": calibration.slots_per_host}})
    hvd.barrier()
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    hvd.shutdown()


def run_job(worker_argv, setup, rate, timeout, ranks=4, slots=2, own_cores=False):
    """Runs ``worker_argv`` (python arguments) as a job of ``ranks`` ranks: on this machine,
    or on emulated hosts of ``slots`` ranks joined by links shaped to ``rate`` (``own_cores``:
    each host's ranks on a share of this machine's CPUs of their own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=jobs_pythonpath())
    if setup == "one-host-tcp":
        env["HOROVOD_SHM_DISABLE"] = "1"
    launch = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(ranks)]
    if setup in ("one-host", "one-host-tcp"):
        subprocess.run(launch + [sys.executable] + worker_argv, env=env, check=True, cwd=REPO,
                       timeout=timeout)
        return None
    from multihost import IFACE, EmulatedHosts, _base_env, write_fake_ssh
    if os.geteuid() != 0:
        raise SystemExit("the two-hosts setup needs root (network namespaces, tc); run with "
                         "--setups one-host otherwise")
    # A SIGTERM (timeout, kill) unwinds through the finally below, which removes the hosts.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    hosts = EmulatedHosts(ranks // slots, subnet=232, own_cores=own_cores)
    with tempfile.TemporaryDirectory() as tmp:
        ssh = write_fake_ssh(tmp, hosts)
        env = _base_env(tmp)
        try:
            hosts.create()
            hosts.shape(rate)
            host_list = ",".join(f"{a}:{slots}" for a in hosts.addresses)
            # The launcher reaches the other hosts with `ssh`: on PATH, multihost's stand-in
            # that enters a host's namespace.
            assert os.path.dirname(ssh) in env["PATH"].split(os.pathsep)
            subprocess.run(hosts.exec_prefix(0) + launch + [
                "-H", host_list, "--network-interface", IFACE, sys.executable] + worker_argv,
                env=env, check=True, cwd=REPO, timeout=timeout)
            return hosts.qdiscs()[0]
        finally:
            hosts.destroy()


def ranks_of(values):
    order = sorted(values, key=values.get)
    return {k: order.index(k) + 1 for k in values}


def _layout(c):
    return f"pp={c['pp']} dp={c['dp']} tp={c['tp']}"


def rounds_of(result):
    """A model's rounds (outputs written before the rounds: their one round)."""
    return result["rounds"] if "rounds" in result else [result]


def judge_round(one):
    """{layout: (predicted s, measured median s)}, the predicted ranks, the measured ranks of
    one round of one model."""
    predicted = {_layout(c): c["step_s"] for c in one["candidates"]}
    measured = {k: median(v) for k, v in one["measured_s"].items()}
    return ({k: (predicted[k], measured[k]) for k in predicted}, ranks_of(predicted),
            ranks_of(measured))


def report(setup, name, result):
    """Prints one model's tables; returns (worst |ratio - 1| over every round, the rounds whose
    measured best was among the planner's top two, the rounds)."""
    rounds = rounds_of(result)
    print(f"\n{setup}, {name} ({MODELS[name][0]}, global batch {MODELS[name][1]})")
    worst, top_two, ratios = 0.0, 0, {}
    for index, one in enumerate(rounds, 1):
        figures, predicted_rank, measured_rank = judge_round(one)
        cal = one["calibration"]
        links = "; ".join(f"{k} ({v['kind']}): {v['latency_s'] * 1e6:.0f} us, "
                          f"{v['bus_bytes_per_s'] / 1e9:.3f} GB/s"
                          for k, v in cal["links"].items())
        conditions = cal["conditions"]
        print(f"round {index}: links: {links}; sharing: slowdown "
              f"{conditions.get('slowdown', 1.0):.2f}, synchronisation "
              f"{conditions.get('wake_s', 0.0) * 1e3:.2f} ms; load at calibration "
              f"{conditions['load_average'][0]:.1f}")
        print(f"{'layout':<18} {'stages':<14} {'mb':>3} {'predicted ms':>12} "
              f"{'measured ms':>11} {'meas/pred':>9} {'pred. rank':>10} {'meas. rank':>10}"
              f"  every step (ms)")
        candidates = {_layout(c): c for c in one["candidates"]}
        for layout in sorted(figures, key=lambda k: figures[k][0]):
            c, (p, m) = candidates[layout], figures[layout]
            ratios.setdefault(layout, []).append(m / p)
            worst = max(worst, abs(m / p - 1))
            stages = " ".join(f"{a}-{b - 1}" for a, b in c["stages"])
            steps = " ".join(f"{t * 1e3:.1f}" for t in one["measured_s"][layout])
            print(f"{layout:<18} {stages:<14} {c['micro_batches']:>3} {p * 1e3:>12.2f} "
                  f"{m * 1e3:>11.2f} {m / p:>9.2f} {predicted_rank[layout]:>10} "
                  f"{measured_rank[layout]:>10}  {steps}")
        best = min(figures, key=lambda k: figures[k][1])
        top_two += predicted_rank[best] <= 2
        print(f"best measured: {best} (predicted rank {predicted_rank[best]})")
    print(f"measured / predicted in each round (a layout within 25% in every round: "
          f"{sum(all(abs(r - 1) <= 0.25 for r in v) for v in ratios.values())} of "
          f"{len(ratios)}):")
    for layout, values in sorted(ratios.items(), key=lambda kv: median(kv[1])):
        print(f"  {layout:<18} " + " ".join(f"{r:.2f}" for r in values)
              + f"   median {median(values):.2f}")
    return worst, top_two, len(rounds)


def replay(raw):
    """Each round's predictions again, by this checkout's cost model from the calibration the
    round took (the measurements stay): how a change of the model fares on the same runs."""
    from horovodlike.torch.planner import Calibration, LayerProfile, LinkProfile, plan
    for setup, ran in raw["setups"].items():
        for name, result in ran["models"].items():
            for one in rounds_of(result):
                cal = one["calibration"]
                model, sample = build_model(name)
                calibration = Calibration(
                    layers=[LayerProfile(**layer) for layer in cal["layers"]],
                    links={k: LinkProfile(**v) for k, v in cal["links"].items()},
                    world_size=cal.get("world_size", 4), batch=cal.get("batch", len(sample)),
                    slots_per_host=cal.get("slots_per_host",
                                           2 if setup == "two-hosts" else None),
                    conditions=cal["conditions"])
                again = plan(model, sample, world_size=calibration.world_size,
                             calibration=calibration, fsdp=False, verbose=False)
                one["candidates"] = [dataclasses.asdict(c) for c in again.candidates]
    return raw


def summary(verdicts):
    print("\nsummary (goal: every layout within 25%, the best measured among the planner's "
          "top two, in every round)")
    for setup, name, worst, top_two, rounds in verdicts:
        print(f"  {setup:<10} {name:<12} largest error over the rounds {worst:>5.0%}  "
              f"best measured in the top two: {top_two} of {rounds} rounds")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,transformer")
    parser.add_argument("--setups", default="one-host,two-hosts",
                        help=f"of {', '.join(SETUPS)} (default one-host,two-hosts)")
    parser.add_argument("--rate", default="1gbit", help="the two-hosts link (tc rate)")
    parser.add_argument("--own-cores", action="store_true",
                        help="give each emulated host its own share of this machine's cores "
                             "(sharing them all, the scheduler's placement of the two hosts' "
                             "ranks makes some layouts' steps vary twofold)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per layout and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of calibrate, plan, measure every layout (default 3)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per job")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--replay", metavar="JSON",
                        help="judge the rounds of an earlier run's JSON again, predicted by "
                             "this checkout's cost model from their own calibrations")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    print(header(), flush=True)
    verdicts = []
    if args.replay:
        with open(args.replay) as f:
            raw = replay(json.load(f))
        print(f"replay of {args.replay} (commit {raw.get('commit', 'unknown')})")
        for setup, ran in raw["setups"].items():
            for name, result in ran["models"].items():
                verdicts.append((setup, name, *report(setup, name, result)))
        return summary(verdicts)
    raw = {**record(), "setups": {}}
    for setup in args.setups.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.json")
            before = os.getloadavg()
            qdisc = run_job([os.path.abspath(__file__), "--worker", "--out", out, "--models",
                             args.models, "--steps", str(args.steps),
                             "--rounds", str(args.rounds)], setup, args.rate,
                            args.timeout, own_cores=args.own_cores)
            after = os.getloadavg()
            with open(out) as f:
                results = json.load(f)
        raw["setups"][setup] = {"load_before": before, "load_after": after, "qdisc": qdisc,
                                "own_cores": bool(qdisc) and args.own_cores,
                                "rate": args.rate if qdisc else None, "models": results}
        print(f"\n== {setup}" + (f" ({args.rate} link between the hosts: {qdisc}"
                                 + ("; each host on cores of its own" if args.own_cores else "")
                                 + ")" if qdisc else "")
              + f"; load average before {before[0]:.1f} {before[1]:.1f} {before[2]:.1f}, "
              f"after {after[0]:.1f} {after[1]:.1f} {after[2]:.1f}")
        for name, result in results.items():
            verdicts.append((setup, name, *report(setup, name, result)))
    summary(verdicts)
    print(footer())
    raw["load_after"] = list(os.getloadavg())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
