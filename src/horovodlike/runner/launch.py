"""horovodlikerun: `horovodlikerun -np N [-H host1:4,host2:4 | --hostfile F] [options] command`.

Takes horovodrun's flags. Starts a rendezvous server, starts the ranks (directly on this machine,
over ssh elsewhere), forwards their output and supervises them until they end.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys

from horovodlike.runner import horovodrun_options, network
from horovodlike.runner.check_build import check_build
from horovodlike.runner.config_file import apply_config_file
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
from horovodlike.runner.settings import DEFAULT_START_TIMEOUT_S, MPI, rank_environment
from horovodlike.runner.settings_parser import make_parser
from horovodlike.runner.ssh import remote_shell_command, ssh_command


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
    return JobSettings(rendezvous_addr=address, rendezvous_port=port, secret_key=secret,
                       start_timeout_s=timeout,
                       settings_env=tuple(rank_environment(vars(args)).items()))


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
    apply_config_file(args, parser, argv)
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
               "HOROVOD_CONTROLLER": os.environ.get("HOROVOD_CONTROLLER", MPI),
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
