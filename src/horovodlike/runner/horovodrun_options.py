"""horovodrun's flags beyond the launcher's own core set: the YAML config file, the stall check,
logging, library options, MPI binding. Each has Horovod's meaning; most become a HOROVOD_*
variable of the ranks. Flags that mean nothing in this build are accepted, and the launcher says
so once on stderr."""

from __future__ import annotations

import argparse

from horovodlike.runner.environment import format_number


def _deprecated(replacement: str):
    """An argparse action storing its const and warning, as horovodrun does, that the flag has
    been replaced."""
    class Deprecated(argparse.Action):
        def __init__(self, option_strings, dest, const=None, help=None, **_):
            super().__init__(option_strings, dest, nargs=0, const=const, help=help)

        def __call__(self, parser, namespace, values, option_string=None):
            namespace.notices_early = getattr(namespace, "notices_early", []) + [
                f"{option_string} is deprecated (Horovod replaced it with {replacement}); it "
                f"works as {replacement}"]
            setattr(namespace, self.dest, self.const)

    return Deprecated


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-file", dest="config_file",
                        help="YAML file of settings (params, autotune, timeline, stall_check, "
                             "library_options, logging, controller); flags given on the command "
                             "line win")
    parser.add_argument("--network-interfaces", dest="network_interfaces",
                        help="comma-separated interfaces that may be used; the first one this "
                             "machine has is used")
    parser.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int,
                        help="slots of a host given without ':N' in -H or the hostfile "
                             "(default 1)")
    parser.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                        dest="prefix_output_with_timestamp", action="store_true",
                        help="start every output line with the time")

    stall = parser.add_argument_group("stall check")
    checks = stall.add_mutually_exclusive_group()
    checks.add_argument("--stall-check", dest="stall_check", action="store_const", const=True,
                        help="warn about ranks that wait for each other "
                             "(HOROVOD_STALL_CHECK_DISABLE=0; the default)")
    checks.add_argument("--no-stall-check", dest="stall_check", action="store_const",
                        const=False, help="no stall warnings, shutdown or deadlock error "
                                          "(HOROVOD_STALL_CHECK_DISABLE=1)")
    stall.add_argument("--stall-check-warning-time-seconds",
                       dest="stall_check_warning_time_seconds", type=float,
                       help="seconds before a stall warning (HOROVOD_STALL_CHECK_TIME_SECONDS, "
                            "default 60)")
    stall.add_argument("--stall-check-shutdown-time-seconds",
                       dest="stall_check_shutdown_time_seconds", type=float,
                       help="seconds before a stall stops the job "
                            "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, default 0: never)")

    logging = parser.add_argument_group("logging")
    stamps = logging.add_mutually_exclusive_group()
    stamps.add_argument("--log-with-timestamp", dest="log_with_timestamp", action="store_const",
                        const=True, help="the core's log lines carry the time "
                                         "(HOROVOD_LOG_HIDE_TIME=0)")
    stamps.add_argument("--log-without-timestamp", dest="log_with_timestamp",
                        action="store_const", const=False,
                        help="the core's log lines without the time (HOROVOD_LOG_HIDE_TIME=1)")
    # Horovod's older spellings of the two, kept by horovodrun with a deprecation warning.
    stamps.add_argument("--log-hide-timestamp", dest="log_with_timestamp",
                        action=_deprecated("--log-without-timestamp"), const=False,
                        help=argparse.SUPPRESS)
    stamps.add_argument("--no-log-hide-timestamp", dest="log_with_timestamp",
                        action=_deprecated("--log-with-timestamp"), const=True,
                        help=argparse.SUPPRESS)

    library = parser.add_argument_group("library options")
    library.add_argument("--tcp", dest="tcp_flag", action="store_true",
                         help="communicate over TCP only (NCCL_IB_DISABLE=1)")
    library.add_argument("--gloo-timeout-seconds", dest="gloo_timeout_seconds", type=float,
                         help="seconds a Gloo operation may wait for a peer "
                              "(HOROVOD_GLOO_TIMEOUT_SECONDS)")
    threads = library.add_mutually_exclusive_group()
    threads.add_argument("--mpi-threads-disable", dest="mpi_threads_disable",
                         action="store_const", const=True,
                         help="initialize MPI without multi-threading support "
                              "(HOROVOD_MPI_THREADS_DISABLE=1)")
    threads.add_argument("--no-mpi-threads-disable", dest="mpi_threads_disable",
                         action="store_const", const=False,
                         help="initialize MPI with multi-threading support, even when the "
                              "environment or the config file says otherwise "
                              "(HOROVOD_MPI_THREADS_DISABLE=0)")
    library.add_argument("--no-autotune", dest="no_autotune", action="store_true",
                         help="no autotuning, even if the config file asks for it "
                              "(HOROVOD_AUTOTUNE=0)")
    library.add_argument("--binding-args", dest="binding_args",
                         help="process binding arguments for mpirun, instead of "
                              "'--bind-to none --map-by slot' (--mpi only)")
    library.add_argument("--thread-affinity", dest="thread_affinity",
                         help="CPU cores for the background thread of each local rank, "
                              "comma-separated (HOROVOD_THREAD_AFFINITY)")
    library.add_argument("--blacklist-cooldown-range", dest="blacklist_cooldown_range",
                         type=int, nargs=2, metavar=("MIN", "MAX"),
                         help="elastic: seconds a failing host stays blacklisted")
    library.add_argument("--num-nccl-streams", dest="num_nccl_streams", type=int,
                         help="NCCL streams per rank (HOROVOD_NUM_NCCL_STREAMS; GPU only)")
    library.add_argument("--torus-allreduce", dest="torus_allreduce", action="store_true",
                         help="2-D torus allreduce over NCCL (HOROVOD_TORUS_ALLREDUCE=1; GPU "
                              "only)")


# --config-file: section -> (key in the file, argument it sets, expected type)
_CONFIG_KEYS = {
    "params": [("fusion_threshold_mb", "fusion_threshold_mb", float),
               ("cycle_time_ms", "cycle_time_ms", float),
               ("cache_capacity", "cache_capacity", int),
               ("hierarchical_allreduce", "hierarchical_allreduce", bool),
               ("hierarchical_allgather", "hierarchical_allgather", bool)],
    "autotune": [("enabled", "autotune", bool), ("log_file", "autotune_log_file", str),
                 ("warmup_samples", "autotune_warmup_samples", int),
                 ("steps_per_sample", "autotune_steps_per_sample", int),
                 ("bayes_opt_max_samples", "autotune_bayes_opt_max_samples", int),
                 ("gaussian_process_noise", "autotune_gaussian_process_noise", float)],
    "timeline": [("filename", "timeline_filename", str),
                 ("mark_cycles", "timeline_mark_cycles", bool)],
    "stall_check": [("enabled", "stall_check", bool),
                    ("warning_time_seconds", "stall_check_warning_time_seconds", float),
                    ("shutdown_time_seconds", "stall_check_shutdown_time_seconds", float)],
    "library_options": [("mpi_threads_disable", "mpi_threads_disable", bool),
                        ("num_nccl_streams", "num_nccl_streams", int),
                        ("gloo_timeout_seconds", "gloo_timeout_seconds", float)],
    "logging": [("level", "log_level", str), ("with_timestamp", "log_with_timestamp", bool)],
}


def apply_config_file(args, parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Fills in the settings of --config-file that the command line did not give."""
    if not args.config_file:
        return
    try:
        import yaml
    except ImportError:
        parser.error("--config-file needs PyYAML: pip install pyyaml")
    try:
        with open(args.config_file) as f:
            config = yaml.safe_load(f) or {}
    except OSError as error:
        parser.error(f"--config-file {args.config_file}: {error.strerror}")
    except yaml.YAMLError as error:
        parser.error(f"--config-file {args.config_file} is not valid YAML: {error}")
    if not isinstance(config, dict):
        parser.error(f"--config-file {args.config_file}: expected a mapping of sections")
    given = _given_on_command_line(parser, argv)
    if "no_autotune" in given:
        given.add("autotune")
    where = f"--config-file {args.config_file}"
    unknown = sorted(set(config) - set(_CONFIG_KEYS) - {"controller"})
    if unknown:
        parser.error(f"{where}: unknown section(s) {', '.join(unknown)} (known: controller, "
                     f"{', '.join(_CONFIG_KEYS)})")
    controller = config.get("controller")
    if controller is not None and not (args.use_gloo or args.use_mpi):
        if str(controller).lower() == "gloo":
            args.use_gloo = True
        elif str(controller).lower() == "mpi":
            args.use_mpi = True
        elif str(controller).lower() != "tcp":
            parser.error(f"{where}: controller must be gloo, mpi or tcp, got '{controller}'")
    for section, keys in _CONFIG_KEYS.items():
        values = config.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            parser.error(f"{where}: section '{section}' must be a mapping")
        known = {key for key, _, _ in keys}
        for key in sorted(set(values) - known):
            parser.error(f"{where}: unknown key '{section}.{key}' (known: "
                         f"{', '.join(sorted(known))})")
        for key, dest, kind in keys:
            if key not in values or dest in given:
                continue
            value = values[key]
            ok = isinstance(value, bool) if kind is bool else \
                isinstance(value, (int, float)) and not isinstance(value, bool) \
                if kind is float else isinstance(value, kind) and not isinstance(value, bool)
            if not ok:
                parser.error(f"{where}: '{section}.{key}' must be a {kind.__name__}, "
                             f"got {value!r}")
            if dest == "log_level":
                value = value.upper()
                if value not in ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"):
                    parser.error(f"{where}: 'logging.level' must be one of TRACE, DEBUG, INFO, "
                                 f"WARNING, ERROR, FATAL, got '{values[key]}'")
            setattr(args, dest, kind(value) if kind is float else value)


def _given_on_command_line(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """Destinations of the options present on the command line (before the command)."""
    import sys
    words = sys.argv[1:] if argv is None else argv
    given = set()
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of options
        for option in action.option_strings:
            for word in words:
                if word == "--" or not word.startswith("-"):
                    continue
                if word == option or word.startswith(option + "="):
                    given.add(action.dest)
    return given


def validate(args, parser: argparse.ArgumentParser) -> None:
    if args.no_autotune:
        args.autotune = False
    for flag, value in (("--stall-check-warning-time-seconds",
                         args.stall_check_warning_time_seconds),
                        ("--stall-check-shutdown-time-seconds",
                         args.stall_check_shutdown_time_seconds),
                        ("--gloo-timeout-seconds", args.gloo_timeout_seconds)):
        if value is not None and not value >= 0:
            parser.error(f"{flag} must be >= 0, got {value:g}")
    if args.stall_check_warning_time_seconds == 0:
        parser.error("--stall-check-warning-time-seconds must be > 0")
    for flag, value in (("--slots-per-host", args.slots_per_host),
                        ("--num-nccl-streams", args.num_nccl_streams)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.blacklist_cooldown_range is not None:
        low, high = args.blacklist_cooldown_range
        if not 0 <= low <= high:
            parser.error(f"--blacklist-cooldown-range needs 0 <= MIN <= MAX, got {low} {high}")
    if args.thread_affinity is not None:
        cores = args.thread_affinity.split(",")
        if not all(core.strip().isdigit() for core in cores):
            parser.error(f"--thread-affinity: expected CPU numbers separated by commas, got "
                         f"'{args.thread_affinity}'")
    if args.binding_args is not None and not args.use_mpi:
        args.notices.append("--binding-args applies to mpirun (--mpi); ranks started "
                            "directly are not bound, so it has no effect here")


def environment(args) -> dict[str, str]:
    """The HOROVOD_* (and NCCL_*) variables these flags give every rank."""
    env = {}
    if args.stall_check is not None:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "0" if args.stall_check else "1"
    if args.stall_check_warning_time_seconds is not None:
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = format_number(
            args.stall_check_warning_time_seconds)
    if args.stall_check_shutdown_time_seconds is not None:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = format_number(
            args.stall_check_shutdown_time_seconds)
    if args.log_with_timestamp is not None:
        env["HOROVOD_LOG_HIDE_TIME"] = "0" if args.log_with_timestamp else "1"
    if args.tcp_flag:
        env["NCCL_IB_DISABLE"] = "1"
    if args.gloo_timeout_seconds is not None:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = format_number(args.gloo_timeout_seconds)
    if args.mpi_threads_disable is not None:
        env["HOROVOD_MPI_THREADS_DISABLE"] = "1" if args.mpi_threads_disable else "0"
    if args.no_autotune:
        env["HOROVOD_AUTOTUNE"] = "0"
    if args.thread_affinity is not None:
        env["HOROVOD_THREAD_AFFINITY"] = ",".join(c.strip() for c in
                                                  args.thread_affinity.split(","))
    if args.num_nccl_streams is not None:
        env["HOROVOD_NUM_NCCL_STREAMS"] = str(args.num_nccl_streams)
    if args.torus_allreduce:
        env["HOROVOD_TORUS_ALLREDUCE"] = "1"
    if args.timeline_mark_cycles is False:
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "0"
    return env


def collect_notices(args) -> None:
    """Flags accepted for compatibility that change nothing in this build."""
    args.notices.extend(getattr(args, "notices_early", []))
    if getattr(args, "use_jsrun", False):
        args.notices.append("--jsrun: jsrun is IBM LSF's launcher, which this build does not "
                            "use; the ranks start with mpirun and the MPI transport, as with "
                            "--mpi")
    if args.tcp_flag:
        args.notices.append("--tcp: ranks talk over TCP already (sets NCCL_IB_DISABLE=1, which "
                            "matters only to NCCL)")
    if args.num_nccl_streams is not None:
        args.notices.append("--num-nccl-streams has no effect: NCCL's collectives run on one "
                            "stream per GPU (docs/gpu.md)")
    if args.torus_allreduce:
        args.notices.append("--torus-allreduce has no effect: use --hierarchical-allreduce "
                            "(NCCL inside hosts, the CPU transport across them)")
    if args.mpi_threads_disable and not args.use_mpi:
        args.notices.append("--mpi-threads-disable applies to the MPI transport (--mpi) only")
    if args.gloo_timeout_seconds is not None and not args.use_gloo:
        args.notices.append("--gloo-timeout-seconds applies to the Gloo transport (--gloo) "
                            "only; HOROVOD_PEER_TIMEOUT_SECONDS bounds the others")
    if args.blacklist_cooldown_range is not None:
        args.notices.append("--blacklist-cooldown-range has no effect: elastic jobs here never "
                            "blacklist a host (a failed worker's slot is retired instead)")
