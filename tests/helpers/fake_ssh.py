"""Stands in for ssh: records its argv as DIR/<pid>.json (DIR = $FAKE_SSH_LOG), then runs the
remote command here with `sh -c`, in an environment as bare as a fresh login's."""

import json
import os
import sys

with open(os.path.join(os.environ["FAKE_SSH_LOG"], f"{os.getpid()}.json"), "w") as f:
    json.dump(sys.argv[1:], f)
os.execve("/bin/sh", ["sh", "-c", sys.argv[-1]],
          {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")})
