"""horovodrun's flags beyond the launcher's core set, each on a real 2-rank job: the variable it
gives the ranks and its effect where it has one here; flags without meaning in this build are
accepted and say so exactly once on stderr."""

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, WORKERS, job_env

WORKER = str(WORKERS / "flags_worker.py")


def launch(flags, mode="env", env=None, np=2):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np), *flags,
               sys.executable, WORKER, mode]
    return subprocess.run(command, env=job_env(env), capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def rank_reports(result, np=2):
    """{rank: what the worker printed}; asserts the job succeeded and every rank reported."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = {}
    for line in result.stdout.splitlines():
        found = re.search(r"<stdout>:rank (\d+): (\{.*\})$", line)
        if found:
            reports[int(found.group(1))] = json.loads(found.group(2))
    assert sorted(reports) == list(range(np)), result.stdout[-3000:]
    return reports


def notices(result):
    return [line for line in result.stderr.splitlines() if line.startswith("horovodlikerun: ")]


# flag(s) -> the variables every rank gets
ENVIRONMENT = [
    (["--stall-check"], {"HOROVOD_STALL_CHECK_DISABLE": "0"}),
    (["--no-stall-check"], {"HOROVOD_STALL_CHECK_DISABLE": "1"}),
    (["--stall-check-warning-time-seconds", "2.5"], {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2.5"}),
    (["--stall-check-shutdown-time-seconds", "9"], {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "9"}),
    (["--log-with-timestamp"], {"HOROVOD_LOG_HIDE_TIME": "0"}),
    (["--tcp"], {"NCCL_IB_DISABLE": "1"}),
    (["--gloo", "--gloo-timeout-seconds", "7"], {"HOROVOD_GLOO_TIMEOUT_SECONDS": "7"}),
    (["--mpi-threads-disable"], {"HOROVOD_MPI_THREADS_DISABLE": "1"}),
    (["--no-autotune"], {"HOROVOD_AUTOTUNE": "0"}),
    (["--thread-affinity", "0,1"], {"HOROVOD_THREAD_AFFINITY": "0,1"}),
    (["--num-nccl-streams", "2"], {"HOROVOD_NUM_NCCL_STREAMS": "2"}),
    (["--torus-allreduce"], {"HOROVOD_TORUS_ALLREDUCE": "1"}),
    (["--network-interfaces", "no-such-nic0,lo"], {"HOROVOD_GLOO_IFACE": "lo"}),
    (["--min-num-proc", "2", "--max-num-proc", "3"], {"HOROVOD_ELASTIC": "1"}),
    (["-H", "localhost", "--slots-per-host", "2"], {"HOROVOD_LOCAL_SIZE": "2"}),
    (["--blacklist-cooldown-range", "5", "10"], {}),
    (["--binding-args", "--bind-to core"], {}),
    (["--log-without-timestamp"], {"HOROVOD_LOG_HIDE_TIME": "1"}),
    (["--log-hide-timestamp"], {"HOROVOD_LOG_HIDE_TIME": "1"}),
    (["--no-log-hide-timestamp"], {"HOROVOD_LOG_HIDE_TIME": "0"}),
    (["--no-mpi-threads-disable"], {"HOROVOD_MPI_THREADS_DISABLE": "0"}),
    (["--no-timeline-mark-cycles"], {"HOROVOD_TIMELINE_MARK_CYCLES": "0"}),
]

# flag -> the one line it prints (flags with no meaning here)
NOTICES = {
    "--tcp": "--tcp: ranks talk over TCP already",
    "--num-nccl-streams": "--num-nccl-streams has no effect",
    "--torus-allreduce": "--torus-allreduce has no effect",
    "--blacklist-cooldown-range": "--blacklist-cooldown-range has no effect",
    "--binding-args": "--binding-args applies to mpirun (--mpi)",
    "--mpi-threads-disable": "--mpi-threads-disable applies to the MPI transport",
    "--log-hide-timestamp": "--log-hide-timestamp is deprecated (Horovod replaced it with "
                            "--log-without-timestamp)",
    "--no-log-hide-timestamp": "--no-log-hide-timestamp is deprecated (Horovod replaced it with "
                               "--log-with-timestamp)",
}

# Every option string of Horovod 0.28.1's horovodrun, with a value where it takes one.
HOROVODRUN_OPTIONS = {
    "-v": None, "--version": None, "-np": "2", "--num-proc": "2", "-cb": None,
    "--check-build": None, "--disable-cache": [], "--start-timeout": ["30"],
    "--network-interfaces": ["lo"], "--network-interface": ["lo"],
    "--output-filename": ["out"], "--verbose": [], "--config-file": None,
    "-p": ["22"], "--ssh-port": ["22"], "-i": None, "--ssh-identity-file": None,
    "--fusion-threshold-mb": ["32"], "--cycle-time-ms": ["2"], "--cache-capacity": ["512"],
    "--hierarchical-allreduce": [], "--no-hierarchical-allreduce": [],
    "--hierarchical-allgather": [], "--no-hierarchical-allgather": [], "--autotune": [],
    "--no-autotune": [], "--autotune-log-file": ["tune.csv"],
    "--autotune-warmup-samples": ["3"], "--autotune-steps-per-sample": ["10"],
    "--autotune-bayes-opt-max-samples": ["20"], "--autotune-gaussian-process-noise": ["0.8"],
    "--min-np": ["2"], "--min-num-proc": ["2"], "--max-np": ["4"], "--max-num-proc": ["4"],
    "--slots-per-host": ["2"], "--elastic-timeout": ["600"], "--reset-limit": ["3"],
    "--blacklist-cooldown-range": ["60", "300"], "--timeline-filename": ["timeline.json"],
    "--timeline-mark-cycles": ["--timeline-filename", "timeline.json"],
    "--no-timeline-mark-cycles": [], "--no-stall-check": [], "--stall-check": [],
    "--stall-check-warning-time-seconds": ["60"], "--stall-check-shutdown-time-seconds": ["0"],
    "--mpi-threads-disable": [], "--no-mpi-threads-disable": [],
    "--mpi-args": ["--tag-output --report-bindings", "--mpi"], "--tcp": [], "--binding-args": ["--bind-to none"],
    "--num-nccl-streams": ["1"], "--thread-affinity": ["0"], "--gloo-timeout-seconds": ["30"],
    "--log-level": ["WARNING"], "--log-with-timestamp": [], "--log-without-timestamp": [],
    "-prefix-timestamp": [], "--prefix-output-with-timestamp": [], "--log-hide-timestamp": [],
    "--no-log-hide-timestamp": [], "-H": ["localhost:2"], "--hosts": ["localhost:2"],
    "-hostfile": None, "--hostfile": None, "--host-discovery-script": None, "--gloo": [],
    "--mpi": [], "--jsrun": [], "-h": None, "--help": None,
}


def test_every_horovodrun_option_is_accepted():
    """Parsed and validated as the launcher does before starting anything (the flags that exit
    at once or need a file are started for real by the tests around this one)."""
    from horovodlike.runner import horovodrun_options, launch as launcher
    parser = launcher.make_parser()
    known = {option for action in parser._actions for option in action.option_strings}
    assert sorted(set(HOROVODRUN_OPTIONS) - known) == []
    assert len(HOROVODRUN_OPTIONS) == 71
    for option, value in HOROVODRUN_OPTIONS.items():
        if value is None:
            continue
        if option in ("--network-interfaces", "--network-interface"):
            value = [launcher.network.interface_names()[0]]
        words = ["-np", "2", option, *value, "python", "-c", "pass"]
        args = parser.parse_args(words)
        args.notices = []
        if args.use_jsrun:
            args.use_mpi = True
        launcher._validate(args, parser)
        horovodrun_options.collect_notices(args)


def test_jsrun_starts_the_ranks_as_mpi_does():
    pytest.importorskip("mpi4py")
    result = launch(["--jsrun"], "init")
    assert all(seen["mpi"] for seen in rank_reports(result).values()), result.stdout
    said = notices(result)
    assert sum("--jsrun: jsrun is IBM LSF's launcher" in line for line in said) == 1, said


@pytest.mark.parametrize("flags, expected", ENVIRONMENT, ids=[" ".join(f) for f, _ in ENVIRONMENT])
def test_flag_reaches_every_rank(flags, expected):
    # An elastic job's workers must join its rounds (init()) before they leave.
    result = launch(flags, "init" if "--min-num-proc" in flags else "env")
    for rank, seen in rank_reports(result).items():
        for name, value in expected.items():
            assert seen[name] == value, (rank, name, seen)
    said = notices(result)
    for flag, text in NOTICES.items():
        if flag in flags:
            assert sum(text in line for line in said) == 1, said
    if not any(flag in flags for flag in NOTICES):
        assert not any("no effect" in line or "applies to" in line for line in said), said


@pytest.mark.parametrize("hosts", ["localhost", "localhost:1"])
def test_slots_per_host_is_only_for_hosts_given_without_slots(hosts):
    """Without it a host has one slot; a host given with ':N' keeps its N."""
    flags = ["-H", hosts] + (["--slots-per-host", "2"] if ":" in hosts else [])
    result = launch(flags)
    assert result.returncode != 0 and "slot" in result.stderr, result.stderr


def test_config_file_values_apply_and_the_command_line_wins(tmp_path):
    config = tmp_path / "horovod.yaml"
    config.write_text("params:\n  fusion_threshold_mb: 2\n  cycle_time_ms: 7\n"
                      "  cache_capacity: 64\n"
                      "stall_check:\n  enabled: true\n  warning_time_seconds: 5\n"
                      "  shutdown_time_seconds: 30\n"
                      "logging:\n  level: debug\n  with_timestamp: true\n"
                      "library_options:\n  gloo_timeout_seconds: 11\n"
                      "autotune:\n  enabled: true\n")
    result = launch(["--config-file", str(config), "--cycle-time-ms", "3", "--no-autotune"])
    for seen in rank_reports(result).values():
        assert seen["HOROVOD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024), seen
        assert seen["HOROVOD_CYCLE_TIME"] == "3", seen  # the command line wins
        assert seen["HOROVOD_CACHE_CAPACITY"] == "64", seen
        assert seen["HOROVOD_STALL_CHECK_DISABLE"] == "0", seen
        assert seen["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "5", seen
        assert seen["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "30", seen
        assert seen["HOROVOD_LOG_LEVEL"] == "DEBUG", seen
        assert seen["HOROVOD_LOG_HIDE_TIME"] == "0", seen
        assert seen["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "11", seen
        assert seen["HOROVOD_AUTOTUNE"] == "0", seen  # --no-autotune beats the file


@pytest.mark.parametrize("text, error", [
    ("params:\n  fusion_threshold: 2\n", "unknown key 'params.fusion_threshold'"),
    ("params:\n  cycle_time_ms: fast\n", "'params.cycle_time_ms' must be a float"),
    ("colours: {}\n", "unknown section(s) colours"),
    ("params: [\n", "is not valid YAML"),
])
def test_config_file_errors_name_what_to_fix(tmp_path, text, error):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = launch(["--config-file", str(config)])
    assert result.returncode == 2 and error in result.stderr, result.stderr


@pytest.mark.parametrize("flag", ["--prefix-output-with-timestamp", "-prefix-timestamp"])
def test_prefix_output_with_timestamp(flag):
    result = launch([flag])
    rank_reports(result)
    stamped = re.compile(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[[01]\]<stdout>:rank ")
    lines = [line for line in result.stdout.splitlines() if "<stdout>:rank " in line]
    assert len(lines) == 2 and all(stamped.match(line) for line in lines), lines
    plain = launch([])
    assert all(line.startswith("[") for line in plain.stdout.splitlines()), plain.stdout


def test_log_with_timestamp_stamps_the_core_log_lines():
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "0.5"}
    stamped = re.compile(r"<stderr>:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} horovodlike WARNING "
                         r"rank 0\] Stalled tensors")
    result = launch(["--log-with-timestamp"], "stall", env)
    rank_reports(result)
    assert any(stamped.search(line) for line in result.stderr.splitlines()), result.stderr
    result = launch([], "stall", env)
    rank_reports(result)
    warnings = [line for line in result.stderr.splitlines() if "Stalled tensors" in line]
    assert warnings and all("<stderr>:[horovodlike WARNING" in w for w in warnings), warnings


def test_thread_affinity_pins_each_local_ranks_background_thread():
    reports = rank_reports(launch(["--thread-affinity", "1,0"], "init"))
    assert reports[0]["loop_cpus"] == "1" and reports[1]["loop_cpus"] == "0", reports
    assert reports[0]["process_cpus"] != "1", reports  # only the background thread


def test_no_stall_check_turns_the_stall_warning_off():
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "0.5"}
    result = launch(["--no-stall-check"], "stall", env)
    rank_reports(result)
    assert "Stalled tensors" not in result.stderr, result.stderr


def test_mpi_flags_reach_mpirun_and_mpi():
    pytest.importorskip("mpi4py")
    result = launch(["--mpi", "--mpi-threads-disable", "--binding-args",
                     "--bind-to core --map-by core", "--tcp"], "init")
    reports = rank_reports(result)
    for seen in reports.values():
        assert seen["mpi_thread_level"] < seen["mpi_thread_multiple"], seen
        assert re.fullmatch(r"\d+", seen["process_cpus"]), seen  # bound to one core
    assert not any("applies to" in line for line in notices(result)), result.stderr
