"""horovodrun's flags beyond the launcher's own core set (the stall check, logging, library
options, MPI binding): how their values are checked, and the notices of flags that mean nothing
in this build, said once on stderr. What each flag is, and the variable it gives the ranks, is
in the settings table (settings.py)."""

from __future__ import annotations

import argparse


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
