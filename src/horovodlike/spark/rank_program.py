"""The program each rank of a TorchDistributor job runs when it runs as its own process:

    python -m horovodlike.spark.rank_program REPORT_DIR function FUNCTION_FILE
    python -m horovodlike.spark.rank_program REPORT_DIR script SCRIPT [ARGS...]

It calls the pickled (function, args, kwargs), rank 0 keeping what it returns in
REPORT_DIR/result.pkl, or runs SCRIPT with ARGS as `python SCRIPT ARGS` would. What it raises is
printed and recorded in REPORT_DIR/failure.<rank> (task.encode_failure's record), so that the
driver can say which rank failed and why; the process then exits non-zero.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
import traceback

from horovodlike.spark.task import decode_failure, encode_failure

RESULT_FILE = "result.pkl"
FAILURE_FILE = "failure."


def read_failures(report_dir: str) -> dict[int, tuple[str, str, str]]:
    """{rank: (host, exception type name, message)} of the ranks that recorded a failure."""
    failures = {}
    for name in os.listdir(report_dir):
        if name.startswith(FAILURE_FILE):
            with open(os.path.join(report_dir, name)) as f:
                failures[int(name[len(FAILURE_FILE):])] = decode_failure(f.read())
    return failures


def _call_function(function_file: str, report_dir: str, rank: int) -> None:
    import cloudpickle
    with open(function_file, "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
    result = fn(*args, **kwargs)
    if rank == 0:
        with open(os.path.join(report_dir, RESULT_FILE), "wb") as f:
            cloudpickle.dump(result, f)


def _run_script(script: str, args: list[str]) -> None:
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main(argv: list[str]) -> int:
    report_dir, kind, target, *rest = argv
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    try:
        if kind == "function":
            _call_function(target, report_dir, rank)
        else:
            _run_script(target, rest)
        return 0
    except SystemExit as error:
        if error.code in (None, 0):
            return 0
        code = error.code if isinstance(error.code, int) else 1
        failure: BaseException = error
    except BaseException as error:  # noqa: BLE001 - every failure is reported, then ends it
        traceback.print_exc()
        code, failure = 1, error
    with open(os.path.join(report_dir, f"{FAILURE_FILE}{rank}"), "w") as f:
        f.write(encode_failure(socket.gethostname(), failure))
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    sys.exit(main(sys.argv[1:]))
