"""Every launcher setting, once: its flags, its key in the --config-file YAML, the variables it
gives the ranks, its type, default and help. The argparse parser (settings_parser.py), the
config-file reader (config_file.py), the ranks' environment (rank_environment below) and
docs/settings.md (settings_markdown.py) are all made from SETTINGS.

How the launcher checks values against each other lives in launch.py and horovodrun_options.py;
this table says what each setting is, not how settings combine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from horovodlike.runner.environment import format_number

# The CPU transports' names (common/backends.py), re-exported for the runner's modules.
from horovodlike.common.backends import GLOO, MPI, TCP, TRANSPORTS  # noqa: F401

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
DEFAULT_START_TIMEOUT_S = 30.0

# --config-file: its sections, in the order error messages list them, and the top-level key
# that picks the transport.
CONFIG_SECTIONS = ("params", "autotune", "timeline", "stall_check", "library_options",
                   "logging")
CONFIG_CONTROLLER_KEY = "controller"


@dataclass(frozen=True)
class Setting:
    """One launcher setting. `name` is its argparse destination; `type` is None for options
    that take no value. A setting with `negative` flags is a switch: its flags store True,
    the negative ones False, and neither leaves it None ("not given")."""

    name: str
    flags: tuple[str, ...]
    help: str
    group: str = ""  # the --help section; "" for the parser's own options
    type: Any = None  # int, float, str; None: a flag (or a switch with `negative`)
    default: Any = None
    negative: tuple[str, ...] = ()
    negative_help: str = ""
    # Older spellings kept with a deprecation notice: (flag, value stored, flag replacing it).
    deprecated: tuple[tuple[str, Any, str], ...] = ()
    exclusive: str = ""  # settings with the same key are mutually exclusive on the command line
    choices: tuple[str, ...] | None = None
    metavar: Any = None
    nargs: Any = None
    action: Any = None  # an argparse action class, for the few options that act when parsed
    config: str = ""  # "section.key" in --config-file
    env: tuple[str, ...] = ()  # the variables it gives every rank (or that give its default)
    env_value: Callable[[Any], str | None] | None = None  # the variables' value; None: unset

    @property
    def is_switch(self) -> bool:
        return bool(self.negative)

    @property
    def is_flag(self) -> bool:
        return self.type is None and not self.negative and self.action is None

    @property
    def value_type(self):
        """The type a --config-file value must have."""
        return bool if self.type is None else self.type

    def rank_environment(self, value) -> dict[str, str]:
        if self.env_value is None:
            return {}
        text = self.env_value(value)
        return {} if text is None else {name: text for name in self.env}


def _text(value) -> str | None:
    return None if value is None else str(value)


def _number(value) -> str | None:
    return None if value is None else format_number(value)


def _one_or_zero(value) -> str | None:
    return None if value is None else "1" if value else "0"


def _zero_or_one(value) -> str | None:
    return None if value is None else "0" if value else "1"


def _when_set(text: str) -> Callable[[Any], str | None]:
    return lambda value: text if value else None


def _megabytes_as_bytes(value) -> str | None:
    return None if value is None else str(int(round(value * 1024 * 1024)))


def _core_list(value) -> str | None:
    return None if value is None else ",".join(core.strip() for core in value.split(","))


_CONTROLLER = "controller and transport (default: the built-in TCP transport)"
_TUNING = "tunable parameters (passed to the ranks)"
_AUTOTUNE = ("autotuning (fusion threshold, cycle time and response cache; those set explicitly "
             "above are held constant)")
_TIMELINE = "timeline (a Chrome trace of every tensor's phases)"
_ELASTIC = "elastic training (on when --host-discovery-script, --min-np or --max-np is given)"
_SSH = "ssh"
_STALL = "stall check"
_LOGGING = "logging"
_LIBRARY = "library options"

SETTINGS: tuple[Setting, ...] = (
    Setting("version", ("-v", "--version"), "print the version and exit", action="version"),
    Setting("num_proc", ("-np", "--num-proc"), "total number of ranks", type=int),
    Setting("check_build", ("-cb", "--check-build"),
            "print the frameworks, controllers and tensor operations of this build and exit"),
    Setting("plan", ("--plan",),
            "instead of a command: rank the (pp, dp, tp) layouts of -np ranks for the model "
            "FUNCTION() returns as (model, sample_input), measuring these hosts' links, and "
            "print the table", type=str, metavar="MODULE:FUNCTION"),
    Setting("hosts", ("-H", "--hosts"),
            "hosts and their slots: host1:4,host2:4 (default localhost:N)", type=str,
            exclusive="hosts"),
    Setting("hostfile", ("-hostfile", "--hostfile"),
            "file with one host a line: 'host slots=N' or 'host:N'", type=str, exclusive="hosts"),
    Setting("start_timeout", ("--start-timeout",),
            "seconds the ranks have to join before the job is stopped (default: "
            "$HOROVOD_START_TIMEOUT, else 30)", type=float, env=("HOROVOD_START_TIMEOUT",)),
    Setting("output_filename", ("--output-filename",),
            "also write each rank's raw output to DIR/rank.<rank>/stdout and stderr", type=str),
    Setting("verbose", ("--verbose",), "print the host assignment and the rendezvous address"),
    Setting("network_interface", ("--network-interface",),
            "interface to listen on and communicate over (HOROVOD_GLOO_IFACE)", type=str,
            env=("HOROVOD_GLOO_IFACE",), env_value=_text),

    Setting("use_gloo", ("--gloo",), "communicate over Gloo (HOROVOD_CPU_OPERATIONS=gloo)",
            group=_CONTROLLER, exclusive="transport",
            env=("HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER"), env_value=_when_set(GLOO)),
    Setting("use_mpi", ("--mpi",),
            "start the ranks with Open MPI's mpirun and communicate over MPI",
            group=_CONTROLLER, exclusive="transport"),
    Setting("use_jsrun", ("--jsrun",),
            "Horovod's LSF launcher: here the same as --mpi (says so once)", group=_CONTROLLER,
            exclusive="transport"),
    Setting("mpi_args", ("--mpi-args",), "extra arguments for mpirun, as one quoted string",
            group=_CONTROLLER, type=str),

    Setting("fusion_threshold_mb", ("--fusion-threshold-mb",),
            "fusion buffer size in MB (HOROVOD_FUSION_THRESHOLD, in bytes)", group=_TUNING,
            type=float, config="params.fusion_threshold_mb", env=("HOROVOD_FUSION_THRESHOLD",),
            env_value=_megabytes_as_bytes),
    Setting("cycle_time_ms", ("--cycle-time-ms",), "cycle time in ms (HOROVOD_CYCLE_TIME)",
            group=_TUNING, type=float, config="params.cycle_time_ms",
            env=("HOROVOD_CYCLE_TIME",), env_value=_number),
    Setting("cache_capacity", ("--cache-capacity",),
            "response cache capacity (HOROVOD_CACHE_CAPACITY)", group=_TUNING, type=int,
            config="params.cache_capacity", env=("HOROVOD_CACHE_CAPACITY",), env_value=_text),
    Setting("disable_cache", ("--disable-cache",),
            "disable the response cache (HOROVOD_CACHE_CAPACITY=0)", group=_TUNING,
            env=("HOROVOD_CACHE_CAPACITY",), env_value=_when_set("0")),
    Setting("hierarchical_allreduce", ("--hierarchical-allreduce",),
            "allreduce inside each host, then across hosts (HOROVOD_HIERARCHICAL_ALLREDUCE=1)",
            group=_TUNING, negative=("--no-hierarchical-allreduce",),
            negative_help="the flat allreduce, even when the environment asks for the "
                          "hierarchical one (HOROVOD_HIERARCHICAL_ALLREDUCE=0)",
            config="params.hierarchical_allreduce", env=("HOROVOD_HIERARCHICAL_ALLREDUCE",),
            env_value=_one_or_zero),
    Setting("hierarchical_allgather", ("--hierarchical-allgather",),
            "allgather inside each host, then across hosts (HOROVOD_HIERARCHICAL_ALLGATHER=1)",
            group=_TUNING, negative=("--no-hierarchical-allgather",),
            negative_help="the flat allgather, even when the environment asks for the "
                          "hierarchical one (HOROVOD_HIERARCHICAL_ALLGATHER=0)",
            config="params.hierarchical_allgather", env=("HOROVOD_HIERARCHICAL_ALLGATHER",),
            env_value=_one_or_zero),
    Setting("log_level", ("--log-level",), "core log level (HOROVOD_LOG_LEVEL)", group=_TUNING,
            type=str, choices=LOG_LEVELS, config="logging.level", env=("HOROVOD_LOG_LEVEL",),
            env_value=_text),

    Setting("autotune", ("--autotune",), "tune the parameters while training (HOROVOD_AUTOTUNE=1)",
            group=_AUTOTUNE, config="autotune.enabled", env=("HOROVOD_AUTOTUNE",),
            env_value=_when_set("1")),
    Setting("autotune_log_file", ("--autotune-log-file",),
            "CSV of every sample and the chosen values, written by rank 0 (HOROVOD_AUTOTUNE_LOG)",
            group=_AUTOTUNE, type=str, config="autotune.log_file",
            env=("HOROVOD_AUTOTUNE_LOG",), env_value=_text),
    Setting("autotune_warmup_samples", ("--autotune-warmup-samples",),
            "samples discarded at the start (HOROVOD_AUTOTUNE_WARMUP_SAMPLES, default 3)",
            group=_AUTOTUNE, type=int, config="autotune.warmup_samples",
            env=("HOROVOD_AUTOTUNE_WARMUP_SAMPLES",), env_value=_text),
    Setting("autotune_steps_per_sample", ("--autotune-steps-per-sample",),
            "training steps per sample (HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE, default 10)",
            group=_AUTOTUNE, type=int, config="autotune.steps_per_sample",
            env=("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",), env_value=_text),
    Setting("autotune_bayes_opt_max_samples", ("--autotune-bayes-opt-max-samples",),
            "samples of the Bayesian optimisation (HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, "
            "default 20)", group=_AUTOTUNE, type=int, config="autotune.bayes_opt_max_samples",
            env=("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",), env_value=_text),
    Setting("autotune_gaussian_process_noise", ("--autotune-gaussian-process-noise",),
            "noise of the Gaussian process, relative to the scores' variance "
            "(HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, default 0.8)", group=_AUTOTUNE,
            type=float, config="autotune.gaussian_process_noise",
            env=("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",), env_value=_number),

    Setting("timeline_filename", ("--timeline-filename",),
            "file rank 0 writes the timeline to (HOROVOD_TIMELINE)", group=_TIMELINE, type=str,
            config="timeline.filename", env=("HOROVOD_TIMELINE",), env_value=_text),
    Setting("timeline_mark_cycles", ("--timeline-mark-cycles",),
            "mark the background loop's cycles in the timeline (HOROVOD_TIMELINE_MARK_CYCLES=1)",
            group=_TIMELINE, negative=("--no-timeline-mark-cycles",),
            negative_help="no cycle marks, even when the environment or the config file asks "
                          "for them (HOROVOD_TIMELINE_MARK_CYCLES=0)",
            config="timeline.mark_cycles", env=("HOROVOD_TIMELINE_MARK_CYCLES",),
            env_value=_one_or_zero),

    Setting("min_np", ("--min-np", "--min-num-proc"), "fewest workers to go on with (default: -np)",
            group=_ELASTIC, type=int),
    Setting("max_np", ("--max-np", "--max-num-proc"), "most workers to run (default: -np)",
            group=_ELASTIC, type=int),
    Setting("host_discovery_script", ("--host-discovery-script",),
            "executable printing the available hosts, one 'host:slots' a line; run every second",
            group=_ELASTIC, type=str),
    Setting("reset_limit", ("--reset-limit",),
            "most times the job may be re-formed before it is stopped", group=_ELASTIC, type=int),
    Setting("elastic_timeout", ("--elastic-timeout",),
            "seconds to wait for enough workers (default 600)", group=_ELASTIC, type=float,
            default=600.0),

    Setting("ssh_port", ("-p", "--ssh-port"), "ssh port on all hosts", group=_SSH, type=int),
    Setting("ssh_identity_file", ("-i", "--ssh-identity-file"), "private key file for ssh",
            group=_SSH, type=str),

    Setting("config_file", ("--config-file",),
            "YAML file of settings (params, autotune, timeline, stall_check, library_options, "
            "logging, controller); flags given on the command line win", type=str),
    Setting("network_interfaces", ("--network-interfaces",),
            "comma-separated interfaces that may be used; the first one this machine has is "
            "used", type=str),
    Setting("slots_per_host", ("--slots-per-host", "--slots"),
            "slots of a host given without ':N' in -H or the hostfile (default 1)", type=int),
    Setting("prefix_output_with_timestamp", ("-prefix-timestamp", "--prefix-output-with-timestamp"),
            "start every output line with the time"),

    Setting("stall_check", ("--stall-check",),
            "warn about ranks that wait for each other (HOROVOD_STALL_CHECK_DISABLE=0; the "
            "default)", group=_STALL, negative=("--no-stall-check",),
            negative_help="no stall warnings, shutdown or deadlock error "
                          "(HOROVOD_STALL_CHECK_DISABLE=1)",
            config="stall_check.enabled", env=("HOROVOD_STALL_CHECK_DISABLE",),
            env_value=_zero_or_one),
    Setting("stall_check_warning_time_seconds", ("--stall-check-warning-time-seconds",),
            "seconds before a stall warning (HOROVOD_STALL_CHECK_TIME_SECONDS, default 60)",
            group=_STALL, type=float, config="stall_check.warning_time_seconds",
            env=("HOROVOD_STALL_CHECK_TIME_SECONDS",), env_value=_number),
    Setting("stall_check_shutdown_time_seconds", ("--stall-check-shutdown-time-seconds",),
            "seconds before a stall stops the job (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, default "
            "0: never)", group=_STALL, type=float, config="stall_check.shutdown_time_seconds",
            env=("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",), env_value=_number),

    Setting("log_with_timestamp", ("--log-with-timestamp",),
            "the core's log lines carry the time (HOROVOD_LOG_HIDE_TIME=0)", group=_LOGGING,
            negative=("--log-without-timestamp",),
            negative_help="the core's log lines without the time (HOROVOD_LOG_HIDE_TIME=1)",
            # Horovod's older spellings, kept by horovodrun with a deprecation warning.
            deprecated=(("--log-hide-timestamp", False, "--log-without-timestamp"),
                        ("--no-log-hide-timestamp", True, "--log-with-timestamp")),
            config="logging.with_timestamp", env=("HOROVOD_LOG_HIDE_TIME",),
            env_value=_zero_or_one),

    Setting("tcp_flag", ("--tcp",), "communicate over TCP only (NCCL_IB_DISABLE=1)",
            group=_LIBRARY, env=("NCCL_IB_DISABLE",), env_value=_when_set("1")),
    Setting("gloo_timeout_seconds", ("--gloo-timeout-seconds",),
            "seconds a Gloo operation may wait for a peer (HOROVOD_GLOO_TIMEOUT_SECONDS)",
            group=_LIBRARY, type=float, config="library_options.gloo_timeout_seconds",
            env=("HOROVOD_GLOO_TIMEOUT_SECONDS",), env_value=_number),
    Setting("mpi_threads_disable", ("--mpi-threads-disable",),
            "initialize MPI without multi-threading support (HOROVOD_MPI_THREADS_DISABLE=1)",
            group=_LIBRARY, negative=("--no-mpi-threads-disable",),
            negative_help="initialize MPI with multi-threading support, even when the "
                          "environment or the config file says otherwise "
                          "(HOROVOD_MPI_THREADS_DISABLE=0)",
            config="library_options.mpi_threads_disable", env=("HOROVOD_MPI_THREADS_DISABLE",),
            env_value=_one_or_zero),
    Setting("no_autotune", ("--no-autotune",),
            "no autotuning, even if the config file asks for it (HOROVOD_AUTOTUNE=0)",
            group=_LIBRARY, env=("HOROVOD_AUTOTUNE",), env_value=_when_set("0")),
    Setting("binding_args", ("--binding-args",),
            "process binding arguments for mpirun, instead of '--bind-to none --map-by slot' "
            "(--mpi only)", group=_LIBRARY, type=str),
    Setting("thread_affinity", ("--thread-affinity",),
            "CPU cores for the background thread of each local rank, comma-separated "
            "(HOROVOD_THREAD_AFFINITY)", group=_LIBRARY, type=str,
            env=("HOROVOD_THREAD_AFFINITY",), env_value=_core_list),
    Setting("blacklist_cooldown_range", ("--blacklist-cooldown-range",),
            "elastic: seconds a failing host stays blacklisted", group=_LIBRARY, type=int,
            nargs=2, metavar=("MIN", "MAX")),
    Setting("num_nccl_streams", ("--num-nccl-streams",),
            "NCCL streams per rank (HOROVOD_NUM_NCCL_STREAMS; GPU only)", group=_LIBRARY,
            type=int, config="library_options.num_nccl_streams",
            env=("HOROVOD_NUM_NCCL_STREAMS",), env_value=_text),
    Setting("torus_allreduce", ("--torus-allreduce",),
            "2-D torus allreduce over NCCL (HOROVOD_TORUS_ALLREDUCE=1; GPU only)", group=_LIBRARY,
            env=("HOROVOD_TORUS_ALLREDUCE",), env_value=_when_set("1")),
)

BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}


def defaults() -> dict[str, Any]:
    """Every setting's value when nothing gives it."""
    return {s.name: (False if s.is_flag else s.default) for s in SETTINGS
            if s.action is None}


def rank_environment(values: dict[str, Any]) -> dict[str, str]:
    """The variables that settings `values` (by name; absent: the default) give every rank.
    In table order, so that a later setting wins (--disable-cache over --cache-capacity)."""
    given = {**defaults(), **values}
    env: dict[str, str] = {}
    for setting in SETTINGS:
        env.update(setting.rank_environment(given.get(setting.name)))
    return env
