"""What the cluster-engine tests compare with: the same training started by horovodlikerun."""

import json
import subprocess
import sys

from conftest import REPO, WORKERS, job_env


def launcher_weights(tmp_path, np_=2):
    """Each rank's weights after tests/workers/cluster_jobs.py's train_linear under the
    launcher."""
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np_),
               sys.executable, str(WORKERS / "cluster_jobs.py"), str(tmp_path)]
    result = subprocess.run(command, env=job_env(), capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text())["weights"]
            for r in range(np_)]
