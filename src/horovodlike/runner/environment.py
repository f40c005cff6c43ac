"""The environment each rank starts with: its HOROVOD_* variables and what it inherits."""

from __future__ import annotations

import re
from dataclasses import dataclass

from horovodlike.runner.hosts import RankAssignment

# Variables that describe the launcher's own login session; on another host they would be wrong.
_NOT_FORWARDED_OVER_SSH = re.compile(
    r"^(HOME|USER|LOGNAME|SHELL|PWD|OLDPWD|SHLVL|HOSTNAME|_|TERM|TERMCAP|DISPLAY|MAIL|"
    r"LS_COLORS|PS1|PS2|PS4|PROMPT_COMMAND|TMPDIR|SSH_.*|XDG_.*|TMUX.*|BASH_FUNC_.*|"
    r"KRB5CCNAME|DBUS_SESSION_BUS_ADDRESS)$")
_SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set to "1" in the ranks horovodlikerun starts (locally or over ssh): they end, with their
# children, when the launcher is gone (common/launcher_watch.py, which names it too: the
# launcher imports nothing that needs the core).
EXIT_WITH_LAUNCHER = "HOROVODLIKE_EXIT_WITH_LAUNCHER"


@dataclass(frozen=True)
class JobSettings:
    """What every rank of the job shares: the rendezvous, and the variables the launcher's
    settings give the ranks (settings.rank_environment)."""

    rendezvous_addr: str
    rendezvous_port: int
    secret_key: str
    start_timeout_s: float
    settings_env: tuple[tuple[str, str], ...] = ()


def format_number(value: float) -> str:
    """5.0 -> "5", 2.5 -> "2.5": what both Python and strtod read back as the same value."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def horovod_environment(assignment: RankAssignment, job: JobSettings) -> dict[str, str]:
    """The HOROVOD_* variables of one rank."""
    env = {
        "HOROVOD_RANK": str(assignment.rank),
        "HOROVOD_SIZE": str(assignment.size),
        "HOROVOD_LOCAL_RANK": str(assignment.local_rank),
        "HOROVOD_LOCAL_SIZE": str(assignment.local_size),
        "HOROVOD_CROSS_RANK": str(assignment.cross_rank),
        "HOROVOD_CROSS_SIZE": str(assignment.cross_size),
        "HOROVOD_HOSTNAME": assignment.hostname,
    }
    env.update(job_environment(job))
    return env


def job_environment(job: JobSettings) -> dict[str, str]:
    """The HOROVOD_* variables every rank shares (all that mpirun's ranks get from us)."""
    env = {
        "HOROVOD_RENDEZVOUS_ADDR": job.rendezvous_addr,
        "HOROVOD_RENDEZVOUS_PORT": str(job.rendezvous_port),
        "HOROVOD_SECRET_KEY": job.secret_key,
        "HOROVOD_START_TIMEOUT": format_number(job.start_timeout_s),
    }
    env.update(dict(job.settings_env))
    return env


def local_rank_environment(launcher_env: dict[str, str],
                           horovod_env: dict[str, str]) -> dict[str, str]:
    """The launcher's whole environment, the rank's HOROVOD_* over it, unbuffered Python output."""
    env = dict(launcher_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(horovod_env)
    return env


def remote_rank_environment(launcher_env: dict[str, str],
                            horovod_env: dict[str, str]) -> dict[str, str]:
    """What an ssh rank gets on its command line: the launcher's environment without the
    variables of its own login session (the remote login sets those), plus the rank's HOROVOD_*."""
    env = {name: value for name, value in launcher_env.items()
           if _SHELL_NAME.match(name) and not _NOT_FORWARDED_OVER_SSH.match(name)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(horovod_env)
    return env
