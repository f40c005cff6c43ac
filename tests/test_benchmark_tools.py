"""The arithmetic of the performance benchmarks, checked on inputs whose answers are known
(no timings): the alpha-beta fit recovers the parameters that generated its points, the timeline
reader nests phases, the MPI column is the faster binding, the emulated hosts' ssh enters the
namespace that owns the address."""

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import alphabeta  # noqa: E402
import fsdp  # noqa: E402
import allreduce  # noqa: E402
import gpu_setup  # noqa: E402
import latency_breakdown  # noqa: E402
import multihost  # noqa: E402
import tensor_parallel  # noqa: E402
import train_bound  # noqa: E402


@pytest.mark.parametrize("algorithm", ["flat-ring", "hierarchical", "MPI", "Gloo"])
def test_alpha_beta_fit_recovers_the_generating_parameters(algorithm):
    c, alpha, beta = 40e-6, 25e-6, 8e-9
    points = []
    for hosts in (2, 4):
        for size in (4096, 65536, 1 << 20, 8 << 20):
            n = 2 * hosts
            if algorithm == "hierarchical":
                steps, wire = 2 * 1 + 2 * (hosts - 1), 2 * (hosts - 1) / hosts
            elif algorithm == "MPI" and size < 10000:
                steps = wire = math.log2(n)
            else:
                steps, wire = 2 * (n - 1), 2 * (n - 1) / n
            points.append((n, hosts, size, c + alpha * steps + beta * size * wire))
    model = alphabeta.fit(points, algorithm)
    assert model["c"] == pytest.approx(c, rel=1e-6)
    assert model["alpha"] == pytest.approx(alpha, rel=1e-6)
    assert model["beta"] == pytest.approx(beta, rel=1e-6)
    assert model["max_rel_error"] < 1e-9
    # 1,024 ranks in 512 hosts of 2, 64 MiB: the ring's formula by hand
    expected_ring = c + alpha * 2 * 1023 + beta * (64 << 20) * 2 * 1023 / 1024
    if algorithm in ("flat-ring", "Gloo", "MPI"):
        assert alphabeta.predict(model, algorithm, 1024, 512, 64 << 20) == pytest.approx(
            expected_ring)


def test_alpha_beta_fit_keeps_parameters_non_negative():
    # Times that fall with the number of steps would need a negative alpha: it is held at 0.
    points = [(4, 2, 4096, 1e-3), (8, 4, 4096, 0.5e-3), (4, 2, 1 << 20, 2e-3),
              (8, 4, 1 << 20, 1.5e-3)]
    model = alphabeta.fit(points, "flat-ring")
    assert min(model["c"], model["alpha"], model["beta"]) >= 0


def test_timeline_phases_nest_and_stay_on_their_row(tmp_path):
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.traced"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.other"}},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},
        {"ph": "E", "ts": 103, "pid": 1},
        {"ph": "B", "name": "ALLREDUCE", "ts": 110, "pid": 1},
        {"ph": "B", "name": "SHM_ALLREDUCE", "ts": 111, "pid": 1},
        {"ph": "B", "name": "ALLREDUCE", "ts": 112, "pid": 2},
        {"ph": "E", "ts": 150, "pid": 1},
        {"ph": "E", "ts": 152, "pid": 1},
        {"ph": "E", "ts": 500, "pid": 2},
    ]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events)[:-1] + ",\n")  # as written while recording: no "]"
    durations = latency_breakdown.phases(latency_breakdown.read_timeline(str(path)),
                                         "allreduce.traced")
    assert durations == {"NEGOTIATE_ALLREDUCE": [3], "SHM_ALLREDUCE": [39], "ALLREDUCE": [42]}


def test_mpi_column_is_the_fastest_configuration_in_each_round():
    table = {"MPI bound": {4096: 2e-6, 1 << 20: 9e-4}, "MPI unbound": {4096: 3e-6, 1 << 20: 5e-4},
             "MPI alg4 bound": {4096: 9e-6, 1 << 20: 7e-4}}
    medians = {"MPI bound": {4096: [2e-6, 2e-6, 4e-6], 1 << 20: [9e-4, 9e-4, 9e-4]},
               "MPI unbound": {4096: [3e-6, 3e-6, 3e-6], 1 << 20: [5e-4, 8e-4, 5e-4]},
               "MPI alg4 bound": {4096: [9e-6, 9e-6, 9e-6], 1 << 20: [7e-4, 4e-4, 7e-4]}}
    choice = allreduce.best_mpi(table, medians, [4096, 1 << 20])
    # the winner of most rounds; the column takes each round's fastest, whichever it was
    assert choice == {4096: "MPI bound", 1 << 20: "MPI unbound"}
    assert medians["MPI"] == {4096: [2e-6, 2e-6, 3e-6], 1 << 20: [5e-4, 4e-4, 5e-4]}
    assert table["MPI"] == {4096: 2e-6, 1 << 20: 5e-4}


def test_memory_bound_is_one_read_and_one_write_of_the_buffer(tmp_path):
    assert allreduce.must_traffic(1 << 20) == 2 << 20
    # the kernel itself, as one rank of one: its bound is its own in-place pass
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    out = tmp_path / "stream.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "allreduce.py"), "--worker",
                          "stream", "--out", str(out), "--sizes", "4K,1M", "--iter-scale", "0.1"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    samples = json.loads(out.read_text())["samples"]
    assert list(samples) == [str(1 << 20)] and all(t > 0 for t in samples[str(1 << 20)])


def test_mpi_configurations_name_open_mpis_tuned_algorithms(tmp_path):
    tuned = allreduce.mpi_configurations("tuned")
    labels = [c["label"] for c in tuned]
    assert labels[:2] == ["MPI bound", "MPI unbound"] and all(l.startswith("MPI ") for l in labels)
    algorithms = {c["mca"]["coll_tuned_allreduce_algorithm"] for c in tuned
                  if "coll_tuned_allreduce_algorithm" in c.get("mca", {})}
    assert algorithms == set(range(1, 7))
    own = [{"label": "MPI mine", "bind": "none", "mca": {"btl": "self,vader"}}]
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(own))
    assert allreduce.mpi_configurations(str(path)) == own


def test_emulated_ssh_runs_the_command_in_the_hosts_namespace(tmp_path):
    hosts = multihost.EmulatedHosts(2, 77)
    ssh = multihost.write_fake_ssh(str(tmp_path), hosts)
    # `ip` replaced by a stub that prints what it was asked to run
    stub = tmp_path / "ip"
    stub.write_text('#!/bin/sh\necho "$@"; echo "TMPDIR=$TMPDIR"\n')
    stub.chmod(0o755)
    run = subprocess.run([ssh, "-o", "BatchMode=yes", "-p", "22", hosts.addresses[1],
                          "cd /x && env A=1 prog"], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"netns exec {hosts.namespaces[1]} sh -c cd /x && env A=1 prog"
    assert lines[1] == f"TMPDIR={tmp_path / hosts.namespaces[1]}"
    unknown = subprocess.run([ssh, "10.0.0.99", "true"], capture_output=True, text=True,
                             env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert unknown.returncode == 255 and "no emulated host 10.0.0.99" in unknown.stderr
    # Hosts with cores of their own: the command runs under taskset on the host's share.
    pinned = multihost.EmulatedHosts(2, 78, own_cores=True)
    os.makedirs(tmp_path / "pinned")
    ssh = multihost.write_fake_ssh(str(tmp_path / "pinned"), pinned)
    run = subprocess.run([ssh, pinned.addresses[1], "prog"], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    cpus = ",".join(map(str, pinned.cpus[1]))
    assert run.stdout.splitlines()[0] == \
        f"netns exec {pinned.namespaces[1]} taskset -c {cpus} sh -c prog", run.stdout
    assert pinned.exec_prefix(0)[-3:] == ["taskset", "-c", ",".join(map(str, pinned.cpus[0]))]


def test_emulated_hosts_split_the_cpus():
    assert multihost.split_cpus(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert multihost.split_cpus(2, [0, 1, 2]) == [[0], [1]]
    assert multihost.split_cpus(3, [4, 5]) == [[4], [5], [4]]
    assert multihost.split_cpus(1, [0, 1]) == [[0, 1]]


def test_rates_are_parsed_as_tc_writes_them():
    assert multihost.parse_rate("1gbit") == 10**9
    assert multihost.parse_rate("500mbit") == 5 * 10**8
    with pytest.raises(SystemExit, match="not a tc rate"):
        multihost.parse_rate("fast")


def test_overlap_is_the_union_of_spans_inside_the_window():
    import timeline_plot
    spans = [(0, 10), (5, 20), (30, 40), (50, 60)]
    assert timeline_plot.union_length(spans, (0, 100)) == 20 + 10 + 10
    assert timeline_plot.union_length(spans, (8, 35)) == 12 + 5
    assert timeline_plot.union_length(spans, (20, 30)) == 0


def test_every_benchmark_rank_gets_a_session_of_its_own():
    # As the launcher's ranks have: the kernel's autogroup scheduler shares CPU between sessions.
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import allreduce; "
            "before = os.getsid(0); allreduce.own_session(); allreduce.own_session(); "
            "print(before, os.getsid(0), os.getpid())")
    run = subprocess.run([sys.executable, "-c", code, str(REPO / "benchmarks")],
                         capture_output=True, text=True, check=True)
    before, after, pid = map(int, run.stdout.split())
    assert before != pid and after == pid


def test_compare_report_gives_same_round_ratios_and_settings(tmp_path):
    # Three rounds of one size: after/before per round 0.5, 2.0, 0.8 -> median 0.8, faster in 2.
    saved = {"builds": {"before": "old", "after": "new"},
             "settings": {"before": {}, "after": {"HOROVOD_CALLER_ROUNDS": "0"}},
             "rounds": 3,
             "per_round": {"allreduce.py hvdl-tcp": {"before": {"4096": [2e-3, 1e-3, 5e-3]},
                                                     "after": {"4096": [1e-3, 2e-3, 4e-3]}}}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(saved))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compare_builds.py"),
                          "--report", str(path)], capture_output=True, text=True, check=True).stdout
    assert "after:  new with HOROVOD_CALLER_ROUNDS=0" in out
    row = next(line for line in out.splitlines() if line.startswith("|   4 KiB"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # medians 2 ms and 2 ms, best 1 ms and 1 ms, same-round median 0.8, 2 of 3 faster
    assert cells[3:] == ["1.00x", "1.00x", "0.80x", "2 of 3"], row


def test_env_settings_are_parsed_and_bad_ones_refused():
    import argparse
    parser = argparse.ArgumentParser()
    assert allreduce.env_settings(parser, ["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(SystemExit):
        allreduce.env_settings(parser, ["NOVALUE"])


@pytest.mark.parametrize("np_,gpus,peers", [(1, 1, ["torch-nccl"]),
                                            (2, 1, ["torch-gloo-cuda"]),
                                            (2, 2, ["torch-nccl", "torch-gloo-cuda"])])
def test_cuda_peers_leave_out_nccl_when_ranks_share_a_gpu(np_, gpus, peers):
    chosen, skipped = gpu_setup.torch_peers(np_, gpus)
    assert [label for label, _ in chosen] == peers
    assert len(chosen) + len(skipped) == 2
    if "torch-nccl" not in peers:
        assert "NCCL refuses several ranks on one GPU" in skipped[0]


@pytest.mark.parametrize("script", ["allreduce.py", "train_step.py"])
def test_cuda_mode_without_a_gpu_fails_clearly(script):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --cuda would run")
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--np", "2",
                          "--cuda"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--cuda: this PyTorch" in run.stderr and "sees no CUDA device" in run.stderr


def test_tensor_parallel_formulas_are_the_layers_collectives():
    """The seed's 3D formula is what a Linear3D pair sends: per layer, the (y-1)/y of the
    gathered input, (z-1)/z of the gathered weight and (x-1)/x of the reduce-scattered partial
    product; the second layer swaps x and y. With z = 1 it is the 2D formula, and 2D on 1 x P
    is 1D's."""
    bs, h, e = 24, 12, 36

    def layer(bs, h, e, x, y, z):
        gathered_input = bs / z * h / x
        gathered_weight = h / x * e / y
        partial = bs / z * e / y
        return ((y - 1) / y * gathered_input + (z - 1) / z * gathered_weight
                + (x - 1) / x * partial)

    for x, y, z in [(2, 2, 2), (2, 3, 4), (3, 1, 2), (4, 2, 1)]:
        sent = 4 * (layer(bs, h, e, x, y, z) + layer(bs, e, h, y, x, z))
        assert tensor_parallel.formula("3d", (x, y, z), (bs, h, e)) == pytest.approx(sent)
    assert tensor_parallel.formula("3d", (2, 3, 1), (bs, h, e)) == \
        pytest.approx(tensor_parallel.formula("2d", (2, 3), (bs, h, e)))
    assert tensor_parallel.formula("2d", (1, 6), (bs, h, e)) == \
        pytest.approx(tensor_parallel.formula("1d", (6,), (bs, h, e)))
    assert tensor_parallel.grid_2d(8) == (2, 4) and tensor_parallel.grid_3d(27) == (3, 3, 3)
    assert tensor_parallel.grid_3d(12) is None
    # Every side >= 2: at 8 ranks the only 3D grid is 2x2x2, and 1 x 8 is no 2D grid.
    assert tensor_parallel._best("3d", 8, (bs, h, e), 3)[1] == (2, 2, 2)
    assert tensor_parallel._best("2d", 8, (bs, h, e), 2)[1] in {(2, 4), (4, 2)}


def test_fsdp_memory_counts_each_storage_once_and_rows_check_losses():
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False))
    model[1].view_of_weight = model[1].weight.detach()[:1]     # shares the weight's storage
    model(torch.ones(1, 4)).sum().backward()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    floats = 4 * 3 + 3 + 3 * 2                                   # parameters once each
    steps = sum(v.numel() * v.element_size() for s in optimizer.state.values()
                for k, v in s.items() if k == "step")
    assert fsdp.held_bytes(model, lambda: optimizer.state) == 4 * 4 * floats + steps
    assert fsdp.memory_bound(1000, 100, 4) == 16 * 1000 / 4 + 8 * 100

    rank = {"step_s": 0.1, "sent_per_step": 10, "held_peak": 4800, "held_after_step": 4000,
            "rss_peak": 1, "rss_growth": 1, "parameters": 400, "largest_module": 200}
    # The bound on 2 ranks: 16 * 400 / 2 + 8 * 200 = 4800 bytes; the second rank holds one more.
    figures = [dict(rank, losses=[1.0, 0.5]), dict(rank, losses=[3.0, 1.5], step_s=0.3,
                                                   held_peak=4801)]
    row = fsdp.summarize(figures, [2.0, 1.0], 2)
    assert row["losses"] == [2.0, 1.0] and row["loss_rel_diff"] == 0.0
    assert row["step_s"] == 0.3 and row["held_peak"] == 4801 and not row["within_bound"]
    assert fsdp.summarize(figures, [2.0, 1.1], 2)["loss_rel_diff"] == pytest.approx(0.1 / 1.1)


def test_training_bound_compares_each_round_with_its_own_windows(capsys):
    kinds = {"horovodlike": [110.0, 150.0], "alone": [90.0, 100.0], "in-step": [95.0, 120.0],
             "exchange": [10.0, 20.0]}
    result = {"kinds": {k: {"ms": v, "cpu_ms": v} for k, v in kinds.items()},
              "tensors": 3, "parameters": 1000}
    args = type("Args", (), {"np": 2, "batch_size": 4, "rounds": 2, "steps": 1})()
    ratios = train_bound.report(result, args)
    assert ratios["to_alone"] == pytest.approx([110 / 100, 150 / 120])
    assert ratios["to_in_step"] == pytest.approx([110 / 105, 150 / 140])
    assert "worst 1.250 (alone + exchange)" in capsys.readouterr().out
