"""The ssh command line that starts one rank on a remote host."""

from __future__ import annotations

import shlex


def remote_shell_command(cwd: str, env: dict[str, str], command: list[str]) -> str:
    """`cd <cwd> && env K=V ... <command>`, every word quoted for the remote POSIX shell."""
    assignments = " ".join(shlex.quote(f"{name}={value}") for name, value in env.items())
    words = " ".join(shlex.quote(word) for word in command)
    return f"cd {shlex.quote(cwd)} && env {assignments} {words}"


# Seconds ssh may take to reach a host: an unreachable one fails then (exit 255, with ssh's own
# message) rather than holding the job until --start-timeout.
CONNECT_TIMEOUT_S = 10


def ssh_command(host: str, remote_command: str, port: int | None = None,
                identity_file: str | None = None) -> list[str]:
    """argv for ssh; "ssh" is looked up on PATH when it runs."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
    if port is not None:
        argv += ["-p", str(port)]
    if identity_file is not None:
        argv += ["-i", identity_file]
    return argv + [host, remote_command]
