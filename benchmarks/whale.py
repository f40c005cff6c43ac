"""Whale's result on emulated hosts: keep the large gradient allreduce inside a host and send
only activations between hosts, against data parallel across them.

    sudo python benchmarks/whale.py --json benchmarks/results/whale.json

Whale (Jia et al., "Whale: Efficient Giant Model Training over Heterogeneous GPUs", USENIX
ATC 2022) reports for BERT-Large that data parallel across servers sends 1.245 GB of
gradients per step over the slow network while pipeline stages across servers, data parallel
inside each, send about 27 MB of activations. Here: a scaled-down BERT-shaped model
(planner_models.py's "bert-small") on 2 emulated hosts x 2 ranks (multihost.py's namespaces)
joined by a link shaped to --rate. Both layouts are trained; for each: the step time and the
bytes through the first host's end of the slow link (its veth's received + sent bytes, from
/proc/net/dev inside its namespace) per step, beside the planner's prediction from its own
calibration, and which layout the planner picks (measured too when it is neither).
"""

import argparse
import dataclasses
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multihost import IFACE  # noqa: E402
from planner import run_job  # noqa: E402
from planner_models import MODELS, build_model, measure, median  # noqa: E402
from provenance import footer, header, record  # noqa: E402

MODEL = "bert-small"
DATA_PARALLEL, PIPELINE = "pp=1 dp=4 tp=1", "pp=2 dp=2 tp=1"
SEED = {"gradient_bytes": 1.245e9, "activation_bytes": 27e6}   # Whale's BERT-Large figures


def link_bytes():
    """Bytes received + sent by this namespace's end of the link between the hosts."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == IFACE:
                values = fields.split()
                return int(values[0]) + int(values[8])
    raise RuntimeError(f"no {IFACE} in /proc/net/dev: not inside an emulated host")


def predicted_link_bytes(candidate, calibration, slots):
    """Bytes the model says cross the first host's link per step (both directions). A line of
    n ranks that leaves the host runs a ring crossing the link once each way with 2(n-1)/n of
    its message, and every such line with a rank on the host does so at once (data parallel:
    the gradients, / tp; tensor parallel: the pairs' activations); a pipeline sends each
    boundary activation between stages on different hosts one way and its gradient back."""
    from horovodlike.torch.planner.cost_model import lines_per_host
    layers, pp, dp, tp = calibration.layers, candidate.pp, candidate.dp, candidate.tp
    if pp > 1:
        host = [s * dp * tp // slots for s in range(pp)]
        return 2 * sum(layers[last - 1].activation_bytes
                       for s, (_, last) in enumerate(candidate.stages[:-1])
                       if host[s] != host[s + 1])
    crossing = 0.0
    if dp * tp > slots and dp > 1:
        ring = 2 * (dp - 1) / dp * sum(layer.parameter_bytes for layer in layers) / tp
        crossing += lines_per_host(slots, tp, dp) * ring
    if tp > slots:
        crossing += 2 * (tp - 1) / tp * sum(sum(layer.tp_messages) for layer in layers)
    return 2 * crossing


def worker(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    model, sample = build_model(MODEL)
    calibration = hvd.calibrate(model, sample)
    result = hvd.plan(model, sample, world_size=hvd.size(), calibration=calibration,
                      fsdp=False, verbose=hvd.rank() == 0)
    target = torch.randn_like(model(sample))
    by_layout = {c.layout: c for c in result.candidates}
    rows = {}
    for layout in dict.fromkeys((DATA_PARALLEL, PIPELINE, result.best.layout)):
        c = by_layout[layout]
        counters = []
        times = measure(c, lambda tp_set: build_model(MODEL, tp_set)[0], sample, target,
                        args.steps, f"whale.{c.pp}x{c.dp}",
                        on_step=lambda: counters.append(link_bytes()))
        rows[layout] = {"candidate": dataclasses.asdict(c), "measured_s": times,
                        "link_bytes_per_step": (counters[1] - counters[0]) / args.steps,
                        "predicted_link_bytes": predicted_link_bytes(
                            c, calibration, calibration.slots_per_host)}
    hvd.barrier()
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"layouts": rows, "planner_best": result.best.layout,
                       "ranking": [c.layout for c in result.candidates],
                       "links": {k: dataclasses.asdict(v)
                                 for k, v in calibration.links.items()},
                       "layers": [dataclasses.asdict(p) for p in calibration.layers],
                       "conditions": calibration.conditions}, f)
    hvd.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="the link between the hosts (tc rate)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    print(header(), flush=True)
    provenance = record()
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "whale.json")
        qdisc = run_job([os.path.abspath(__file__), "--worker", "--out", out, "--steps",
                         str(args.steps)], "two-hosts", args.rate, args.timeout)
        with open(out) as f:
            result = json.load(f)
    after = os.getloadavg()
    result.update(provenance, rate=args.rate, qdisc=qdisc, load_before=before,
                  load_after=after, seed=SEED, cores=os.cpu_count())
    print_report(result)
    print(footer())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def print_report(result):
    links = "; ".join(f"{k} ({v['kind']}): {v['latency_s'] * 1e6:.0f} us, "
                      f"{v['bus_bytes_per_s'] / 1e6:.1f} MB/s bus" for k, v in
                      result["links"].items())
    params = sum(p["parameter_bytes"] for p in result["layers"])
    print(f"load average before {result['load_before'][0]:.1f}, after "
          f"{result['load_after'][0]:.1f}; {result['cores']} cores")
    print(f"2 emulated hosts x 2 ranks, {result['rate']} between them ({result['qdisc']})")
    print(f"model: {MODELS[MODEL][0]}, global batch {MODELS[MODEL][1]}: "
          f"{params / 1e6:.1f} MB of gradients per step; links calibrated: {links}\n")
    print(f"{'layout':<16} {'slow-link MB/step':>18} {'predicted':>10} {'step ms':>8} "
          f"{'predicted':>10}  every step (ms)")
    for layout, row in result["layouts"].items():
        steps = " ".join(f"{t * 1e3:.0f}" for t in row["measured_s"])
        print(f"{layout:<16} {row['link_bytes_per_step'] / 1e6:>18.2f} "
              f"{row['predicted_link_bytes'] / 1e6:>10.2f} {median(row['measured_s']) * 1e3:>8.0f} "
              f"{row['candidate']['step_s'] * 1e3:>10.0f}  {steps}")
    dp, pp = (result["layouts"][k] for k in (DATA_PARALLEL, PIPELINE))
    faster = min(result["layouts"], key=lambda k: median(result["layouts"][k]["measured_s"]))
    print(f"\nbytes over the slow link, data parallel / pipeline: measured "
          f"{dp['link_bytes_per_step'] / pp['link_bytes_per_step']:.0f}x, Whale's BERT-Large "
          f"{SEED['gradient_bytes'] / SEED['activation_bytes']:.0f}x "
          f"({SEED['gradient_bytes'] / 1e9:.3f} GB of gradients against about "
          f"{SEED['activation_bytes'] / 1e6:.0f} MB of activations)")
    print(f"measured faster: {faster}; the planner picks {result['planner_best']} "
          f"(its ranking: {', '.join(result['ranking'])})")


if __name__ == "__main__":
    main()
