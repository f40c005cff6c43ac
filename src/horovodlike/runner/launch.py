"""horovodlikerun: `horovodlikerun -np N [-H host1:4,host2:4 | --hostfile F] [options] command`.

Takes horovodrun's flags. Starts a rendezvous server, starts the ranks (directly on this machine,
over ssh elsewhere), forwards their output and supervises them until they end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import sys

from horovodlike.runner import horovodrun_options, network
from horovodlike.runner.check_build import check_build
from horovodlike.runner.elastic_driver import ElasticDriver, discover_with_script
from horovodlike.runner.environment import (EXIT_WITH_LAUNCHER, JobSettings, format_number,
                                            horovod_environment, job_environment,
                                            local_rank_environment, remote_rank_environment)
from horovodlike.runner.hosts import HostError, HostSlots, assign_ranks, parse_hostfile, parse_hosts
from horovodlike.runner.job import Job
from horovodlike.runner.mpi_run import (MPIRUN_SETS_PER_RANK, MpiError, MpiJob,
                                        find_open_mpi_mpirun, forwarded_names, mpirun_command)
from horovodlike.runner.output import Console
from horovodlike.runner.rank_process import RankProcess
from horovodlike.runner.rendezvous import RendezvousServer
from horovodlike.runner.ssh import remote_shell_command, ssh_command

DEFAULT_START_TIMEOUT_S = 30.0
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


def package_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("horovodlike")
    except (ImportError, PackageNotFoundError):
        pass
    try:
        import horovodlike
        return getattr(horovodlike, "__version__", "unknown")
    except ImportError:
        return "unknown"


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(package_version())
        parser.exit()


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horovodlikerun",
        description="Starts a horovodlike job: N copies of a command, one per rank.",
        usage="%(prog)s -np N [-H host1:4,host2:4 | --hostfile FILE] [options] command ...")
    parser.add_argument("-v", "--version", action=_VersionAction,
                        help="print the version and exit")
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int,
                        help="total number of ranks")
    parser.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                        help="print the frameworks, controllers and tensor operations of this "
                             "build and exit")
    parser.add_argument("--plan", dest="plan", metavar="MODULE:FUNCTION",
                        help="instead of a command: rank the (pp, dp, tp) layouts of -np ranks "
                             "for the model FUNCTION() returns as (model, sample_input), "
                             "measuring these hosts' links, and print the table")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts",
                       help="hosts and their slots: host1:4,host2:4 (default localhost:N)")
    hosts.add_argument("-hostfile", "--hostfile", dest="hostfile",
                       help="file with one host a line: 'host slots=N' or 'host:N'")
    parser.add_argument("--start-timeout", dest="start_timeout", type=float,
                        help="seconds the ranks have to join before the job is stopped "
                             "(default: $HOROVOD_START_TIMEOUT, else 30)")
    parser.add_argument("--output-filename", dest="output_filename",
                        help="also write each rank's raw output to "
                             "DIR/rank.<rank>/stdout and stderr")
    parser.add_argument("--verbose", action="store_true",
                        help="print the host assignment and the rendezvous address")
    parser.add_argument("--network-interface", dest="network_interface",
                        help="interface to listen on and communicate over (HOROVOD_GLOO_IFACE)")

    controller = parser.add_argument_group("controller and transport (default: the built-in "
                                           "TCP transport)")
    backends = controller.add_mutually_exclusive_group()
    backends.add_argument("--gloo", dest="use_gloo", action="store_true",
                          help="communicate over Gloo (HOROVOD_CPU_OPERATIONS=gloo)")
    backends.add_argument("--mpi", dest="use_mpi", action="store_true",
                          help="start the ranks with Open MPI's mpirun and communicate over MPI")
    backends.add_argument("--jsrun", dest="use_jsrun", action="store_true",
                          help="Horovod's LSF launcher: here the same as --mpi (says so once)")
    controller.add_argument("--mpi-args", dest="mpi_args",
                            help="extra arguments for mpirun, as one quoted string")

    tuning = parser.add_argument_group("tunable parameters (passed to the ranks)")
    tuning.add_argument("--fusion-threshold-mb", dest="fusion_threshold_mb", type=float,
                        help="fusion buffer size in MB (HOROVOD_FUSION_THRESHOLD, in bytes)")
    tuning.add_argument("--cycle-time-ms", dest="cycle_time_ms", type=float,
                        help="cycle time in ms (HOROVOD_CYCLE_TIME)")
    tuning.add_argument("--cache-capacity", dest="cache_capacity", type=int,
                        help="response cache capacity (HOROVOD_CACHE_CAPACITY)")
    tuning.add_argument("--disable-cache", dest="disable_cache", action="store_true",
                        help="disable the response cache (HOROVOD_CACHE_CAPACITY=0)")
    hierarchical = tuning.add_mutually_exclusive_group()
    hierarchical.add_argument("--hierarchical-allreduce", dest="hierarchical_allreduce",
                              action="store_const", const=True,
                              help="allreduce inside each host, then across hosts "
                                   "(HOROVOD_HIERARCHICAL_ALLREDUCE=1)")
    hierarchical.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce",
                              action="store_const", const=False,
                              help="the flat allreduce, even when the environment asks for the "
                                   "hierarchical one (HOROVOD_HIERARCHICAL_ALLREDUCE=0)")
    hierarchical_allgather = tuning.add_mutually_exclusive_group()
    hierarchical_allgather.add_argument(
        "--hierarchical-allgather", dest="hierarchical_allgather", action="store_const",
        const=True, help="allgather inside each host, then across hosts "
                         "(HOROVOD_HIERARCHICAL_ALLGATHER=1)")
    hierarchical_allgather.add_argument(
        "--no-hierarchical-allgather", dest="hierarchical_allgather", action="store_const",
        const=False, help="the flat allgather, even when the environment asks for the "
                          "hierarchical one (HOROVOD_HIERARCHICAL_ALLGATHER=0)")
    tuning.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS,
                        help="core log level (HOROVOD_LOG_LEVEL)")

    autotune = parser.add_argument_group(
        "autotuning (fusion threshold, cycle time and response cache; those set explicitly "
        "above are held constant)")
    autotune.add_argument("--autotune", dest="autotune", action="store_true",
                          help="tune the parameters while training (HOROVOD_AUTOTUNE=1)")
    autotune.add_argument("--autotune-log-file", dest="autotune_log_file",
                          help="CSV of every sample and the chosen values, written by rank 0 "
                               "(HOROVOD_AUTOTUNE_LOG)")
    autotune.add_argument("--autotune-warmup-samples", dest="autotune_warmup_samples", type=int,
                          help="samples discarded at the start (HOROVOD_AUTOTUNE_WARMUP_SAMPLES,"
                               " default 3)")
    autotune.add_argument("--autotune-steps-per-sample", dest="autotune_steps_per_sample",
                          type=int, help="training steps per sample "
                                         "(HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE, default 10)")
    autotune.add_argument("--autotune-bayes-opt-max-samples",
                          dest="autotune_bayes_opt_max_samples", type=int,
                          help="samples of the Bayesian optimisation "
                               "(HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, default 20)")
    autotune.add_argument("--autotune-gaussian-process-noise",
                          dest="autotune_gaussian_process_noise", type=float,
                          help="noise of the Gaussian process, relative to the scores' variance "
                               "(HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, default 0.8)")

    timeline = parser.add_argument_group("timeline (a Chrome trace of every tensor's phases)")
    timeline.add_argument("--timeline-filename", dest="timeline_filename",
                          help="file rank 0 writes the timeline to (HOROVOD_TIMELINE)")
    cycles = timeline.add_mutually_exclusive_group()
    cycles.add_argument("--timeline-mark-cycles", dest="timeline_mark_cycles",
                        action="store_const", const=True,
                        help="mark the background loop's cycles in the timeline "
                             "(HOROVOD_TIMELINE_MARK_CYCLES=1)")
    cycles.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles",
                        action="store_const", const=False,
                        help="no cycle marks, even when the environment or the config file "
                             "asks for them (HOROVOD_TIMELINE_MARK_CYCLES=0)")

    elastic = parser.add_argument_group(
        "elastic training (on when --host-discovery-script, --min-np or --max-np is given)")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int,
                         help="fewest workers to go on with (default: -np)")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int,
                         help="most workers to run (default: -np)")
    elastic.add_argument("--host-discovery-script", dest="host_discovery_script",
                         help="executable printing the available hosts, one 'host:slots' a "
                              "line; run every second")
    elastic.add_argument("--reset-limit", dest="reset_limit", type=int,
                         help="most times the job may be re-formed before it is stopped")
    elastic.add_argument("--elastic-timeout", dest="elastic_timeout", type=float, default=600.0,
                         help="seconds to wait for enough workers (default 600)")

    ssh = parser.add_argument_group("ssh")
    ssh.add_argument("-p", "--ssh-port", dest="ssh_port", type=int, help="ssh port on all hosts")
    ssh.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file",
                     help="private key file for ssh")

    horovodrun_options.add_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def _start_timeout(args, parser) -> float:
    if args.start_timeout is not None:
        value = args.start_timeout
    elif os.environ.get("HOROVOD_START_TIMEOUT"):
        try:
            value = float(os.environ["HOROVOD_START_TIMEOUT"])
        except ValueError:
            parser.error(f"HOROVOD_START_TIMEOUT must be a number of seconds, "
                         f"got '{os.environ['HOROVOD_START_TIMEOUT']}'")
    else:
        value = DEFAULT_START_TIMEOUT_S
    if not value > 0:
        parser.error(f"the start timeout must be positive, got {value:g}")
    return value


def _validate(args, parser) -> None:
    if args.num_proc is None:
        parser.error("-np/--num-proc is required")
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.plan:
        if args.command:
            parser.error("--plan takes no command: the ranks run the planner")
        args.command = [sys.executable, "-m", "horovodlike.torch.planner", args.plan]
    if not args.command:
        parser.error("no command given: horovodlikerun -np N command ...")
    if args.fusion_threshold_mb is not None and args.fusion_threshold_mb < 0:
        parser.error("--fusion-threshold-mb must be >= 0")
    if args.cycle_time_ms is not None and not args.cycle_time_ms > 0:
        parser.error("--cycle-time-ms must be > 0")
    if args.cache_capacity is not None and args.cache_capacity < 0:
        parser.error("--cache-capacity must be >= 0")
    for flag, value, least in (("--autotune-warmup-samples", args.autotune_warmup_samples, 0),
                               ("--autotune-steps-per-sample", args.autotune_steps_per_sample, 1),
                               ("--autotune-bayes-opt-max-samples",
                                args.autotune_bayes_opt_max_samples, 1)):
        if value is not None and value < least:
            parser.error(f"{flag} must be >= {least}, got {value}")
    noise = args.autotune_gaussian_process_noise
    if noise is not None and not 0 <= noise < float("inf"):
        parser.error(f"--autotune-gaussian-process-noise must be a finite number >= 0, "
                     f"got {noise}")
    if args.timeline_mark_cycles and not args.timeline_filename:
        parser.error("--timeline-mark-cycles needs --timeline-filename")
    if args.ssh_port is not None and not 0 < args.ssh_port < 65536:
        parser.error(f"--ssh-port must be a port number, got {args.ssh_port}")
    if args.ssh_identity_file is not None and not os.path.isfile(args.ssh_identity_file):
        parser.error(f"--ssh-identity-file {args.ssh_identity_file} does not exist")
    if args.mpi_args is not None and not args.use_mpi:
        parser.error("--mpi-args needs --mpi")
    horovodrun_options.validate(args, parser)
    if args.network_interfaces is not None and args.network_interface is None:
        wanted = [name.strip() for name in args.network_interfaces.split(",") if name.strip()]
        present = [name for name in wanted if name in network.interface_names()]
        if not present:
            parser.error(f"--network-interfaces {args.network_interfaces}: none of them is an "
                         f"interface of this machine ({', '.join(network.interface_names())})")
        args.network_interface = present[0]
    if args.network_interface is not None:
        if args.network_interface not in network.interface_names():
            parser.error(f"--network-interface {args.network_interface}: no such interface "
                         f"(this machine has {', '.join(network.interface_names())})")


def _hosts(args) -> list[HostSlots]:
    slots = args.slots_per_host or 1
    if args.hosts:
        return parse_hosts(args.hosts, default_slots=slots)
    if args.hostfile:
        return parse_hostfile(args.hostfile, default_slots=slots)
    return [HostSlots("localhost", args.num_proc)]


def _rendezvous_addresses(all_local: bool, interface: str | None, parser) -> tuple[str, str]:
    """(address to bind, address the ranks connect to)."""
    if all_local:
        return "127.0.0.1", "127.0.0.1"
    if interface is not None:
        address = network.interface_ipv4(interface)
        if address is None:
            parser.error(f"--network-interface {interface} has no IPv4 address")
        return address, address
    address = network.guess_routable_address()
    return address, address  # only the interface the ranks use, never every interface


def _job_settings(args, address: str, port: int, secret: str, timeout: float) -> JobSettings:
    fusion = None
    if args.fusion_threshold_mb is not None:
        fusion = int(round(args.fusion_threshold_mb * 1024 * 1024))
    cache = 0 if args.disable_cache else args.cache_capacity
    return JobSettings(rendezvous_addr=address, rendezvous_port=port, secret_key=secret,
                       start_timeout_s=timeout, fusion_threshold_bytes=fusion,
                       cycle_time_ms=args.cycle_time_ms, cache_capacity=cache,
                       log_level=args.log_level, network_interface=args.network_interface,
                       cpu_operations="gloo" if args.use_gloo else None,
                       autotune=args.autotune, autotune_log_file=args.autotune_log_file,
                       autotune_warmup_samples=args.autotune_warmup_samples,
                       autotune_steps_per_sample=args.autotune_steps_per_sample,
                       autotune_bayes_opt_max_samples=args.autotune_bayes_opt_max_samples,
                       autotune_gaussian_process_noise=args.autotune_gaussian_process_noise,
                       hierarchical_allreduce=args.hierarchical_allreduce,
                       hierarchical_allgather=args.hierarchical_allgather,
                       timeline_filename=args.timeline_filename,
                       timeline_mark_cycles=bool(args.timeline_mark_cycles),
                       extra_env=tuple(horovodrun_options.environment(args).items()))


def _is_elastic(args) -> bool:
    return any(v is not None for v in (args.host_discovery_script, args.min_np, args.max_np))


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.check_build:
        return check_build()
    args.notices = []
    if args.use_jsrun:
        args.use_mpi = True  # Horovod's --jsrun launches with the MPI controller
    horovodrun_options.apply_config_file(args, parser, argv)
    _validate(args, parser)
    horovodrun_options.collect_notices(args)
    for notice in args.notices:
        print(f"horovodlikerun: {notice}", file=sys.stderr, flush=True)
    if _is_elastic(args):
        if args.use_mpi:
            parser.error("--mpi cannot be combined with elastic training")
        return _run_elastic(args, parser)
    try:
        assignments = assign_ranks(_hosts(args), args.num_proc)
    except HostError as error:
        parser.error(str(error))
    timeout = _start_timeout(args, parser)
    local = {a.hostname: network.is_local_host(a.hostname) for a in assignments}
    bind_address, connect_address = _rendezvous_addresses(
        all(local.values()), args.network_interface, parser)

    if args.use_mpi:
        def run_mpirun(console, server, job, launcher_env, cwd):
            return _run_with_mpirun(args, parser, job, assignments, all(local.values()),
                                    console)
        return _with_rendezvous(args, bind_address, connect_address, timeout, run_mpirun)

    def run(console, server, job, launcher_env, cwd):
        processes = [_rank_process(args, a, horovod_environment(a, job), local[a.hostname],
                                   launcher_env, cwd) for a in assignments]
        if args.verbose:
            _print_plan(console, processes, bind_address, connect_address, server.port)
        return Job(processes, server, console, timeout, output_dir=args.output_filename,
                   verbose=args.verbose).run()
    return _with_rendezvous(args, bind_address, connect_address, timeout, run)


def _with_rendezvous(args, bind_address, connect_address, timeout, run) -> int:
    """Starts the rendezvous server with a new job secret, runs
    `run(console, server, job_settings, launcher_env, cwd)` and stops the server."""
    console = Console(sys.stdout.buffer, sys.stderr.buffer,
                      timestamps=args.prefix_output_with_timestamp)
    secret = secrets.token_hex(32)
    server = RendezvousServer(secret, host=bind_address)
    try:
        server.start()
    except OSError as error:
        console.message(f"cannot start the rendezvous server on {bind_address}: {error}")
        return 1
    try:
        job = _job_settings(args, connect_address, server.port, secret, timeout)
        return run(console, server, job, dict(os.environ), os.getcwd())
    finally:
        server.stop()


def _run_with_mpirun(args, parser, job: JobSettings, assignments, all_local: bool,
                     console: Console) -> int:
    """--mpi: mpirun starts and places the ranks. They still get the rendezvous server, which
    HOROVOD_CPU_OPERATIONS=gloo or tcp under mpirun use."""
    try:
        mpirun = find_open_mpi_mpirun()
    except MpiError as error:
        parser.error(str(error))
    try:
        mpi_args = shlex.split(args.mpi_args or "")
    except ValueError as error:
        parser.error(f"--mpi-args: {error}")
    job_env = {"PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1"),
               "HOROVOD_CONTROLLER": os.environ.get("HOROVOD_CONTROLLER", "mpi"),
               **job_environment(job)}
    env = {name: value for name, value in os.environ.items()
           if name not in MPIRUN_SETS_PER_RANK}
    env.update(job_env)
    argv = mpirun_command(
        mpirun, _hosts(args), args.num_proc, args.command, forwarded_names(os.environ, job_env),
        as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
        oversubscribe=all_local and args.num_proc > (os.cpu_count() or 1),
        network_interface=args.network_interface, ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file, mpi_args=mpi_args,
        binding_args=shlex.split(args.binding_args) if args.binding_args else None)
    if args.verbose:
        console.message("running: " + " ".join(shlex.quote(word) for word in argv), "stdout")
    hostnames = {a.rank: a.hostname for a in assignments}
    return MpiJob(argv, env, console, args.num_proc, hostnames,
                  output_dir=args.output_filename).run()


def _rank_process(args, assignment, rank_env, is_local, launcher_env, cwd) -> RankProcess:
    """A rank started directly on this machine, or through ssh on another. Either ends when
    this launcher is gone (horovodlike/common/launcher_watch.py)."""
    rank_env = {**rank_env, EXIT_WITH_LAUNCHER: "1"}
    if is_local:
        return RankProcess(assignment, list(args.command),
                           local_rank_environment(launcher_env, rank_env), via_ssh=False)
    remote = remote_shell_command(cwd, remote_rank_environment(launcher_env, rank_env),
                                  args.command)
    argv = ssh_command(assignment.hostname, remote, args.ssh_port, args.ssh_identity_file)
    return RankProcess(assignment, argv, launcher_env, via_ssh=True)


def _run_elastic(args, parser) -> int:
    min_np = args.min_np if args.min_np is not None else args.num_proc
    max_np = args.max_np if args.max_np is not None else max(args.num_proc, min_np)
    if not 1 <= min_np <= args.num_proc <= max_np:
        parser.error(f"elastic training needs 1 <= --min-np ({min_np}) <= -np "
                     f"({args.num_proc}) <= --max-np ({max_np})")
    if args.reset_limit is not None and args.reset_limit < 0:
        parser.error("--reset-limit must be >= 0")
    if args.host_discovery_script:
        script = args.host_discovery_script

        def discover():
            return discover_with_script(script)
        try:
            first = discover()
        except HostError as error:
            parser.error(str(error))
    else:
        static = _hosts(args)

        def discover():
            return static
        first = static
    timeout = _start_timeout(args, parser)
    local = all(network.is_local_host(h.hostname) for h in first) if first else True
    bind_address, connect_address = _rendezvous_addresses(local, args.network_interface, parser)

    def run(console, server, job, launcher_env, cwd):
        def make_process(assignment, worker_id):
            env = horovod_environment(assignment, job)
            env.update({"HOROVOD_ELASTIC": "1", "HOROVOD_ELASTIC_WORKER_ID": worker_id,
                        "HOROVOD_ELASTIC_TIMEOUT": format_number(args.elastic_timeout)})
            return _rank_process(args, assignment, env,
                                 network.is_local_host(assignment.hostname), launcher_env, cwd)
        driver = ElasticDriver(discover, make_process, min_np, max_np, args.reset_limit,
                               server, console, args.elastic_timeout,
                               output_dir=args.output_filename, verbose=args.verbose,
                               start_timeout_s=timeout)
        return driver.run()
    return _with_rendezvous(args, bind_address, connect_address, timeout, run)


def _print_plan(console: Console, processes: list[RankProcess], bind_address: str,
                connect_address: str, port: int) -> None:
    console.message(f"rendezvous server listening on {bind_address}:{port}; "
                    f"ranks connect to {connect_address}:{port}", "stdout")
    console.message("host assignment:", "stdout")
    for p in processes:
        a = p.assignment
        console.message(f"  rank {a.rank} on {a.hostname} ({'ssh' if p.via_ssh else 'local'}): "
                        f"local rank {a.local_rank} of {a.local_size}, "
                        f"cross rank {a.cross_rank} of {a.cross_size}", "stdout")


if __name__ == "__main__":
    sys.exit(main())
