"""Stands in for ssh: records its argv as DIR/<pid>.json (DIR = $FAKE_SSH_LOG), then runs the
remote command here with `sh -c`, in an environment as bare as a fresh login's.

With FAKE_SSH_DETACH=1 the remote command runs as it does on a real remote host: in a session of
its own (sshd's), as a child of this stand-in, which waits for it and exits with its code; a
signal to this stand-in (or to its process group) does not reach the command."""

import json
import os
import sys

with open(os.path.join(os.environ["FAKE_SSH_LOG"], f"{os.getpid()}.json"), "w") as f:
    json.dump(sys.argv[1:], f)
command = ["sh", "-c", sys.argv[-1]]
login = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
if os.environ.get("FAKE_SSH_DETACH") == "1":
    remote = os.fork()
    if remote == 0:
        os.setsid()
        os.execve("/bin/sh", command, login)
    _, status = os.waitpid(remote, 0)
    sys.exit(os.waitstatus_to_exitcode(status) % 256)
os.execve("/bin/sh", command, login)
