"""The elastic chaos run (benchmarks/elastic_chaos.py), short: for 25 s a worker of four is
killed or stopped every 3 s or so and a new one offered by the discovery script; at the end
every committed step must be there exactly once and the model must equal a single-process
replay of them. The long run's figures are in docs/elastic.md."""

import json
import subprocess
import sys

from conftest import REPO, job_env


def test_elastic_job_survives_random_kills_and_stops(tmp_path):
    out = tmp_path / "chaos.json"
    command = [sys.executable, str(REPO / "benchmarks" / "elastic_chaos.py"), "--duration", "25",
               "--interval", "3", "--seed", "3", "--workdir", str(tmp_path / "job"),
               "--out", str(out)]
    result = subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=600)
    summary = json.loads(out.read_text())
    assert result.returncode == 0 and summary["problems"] == [], result.stdout[-6000:]
    assert summary["kills"] + summary["stops"] >= 3, summary["attacks"]
    # Training went on after the last attack: a commit followed each one.
    assert all(a["recovery_s"] is not None for a in summary["attacks"]), summary["attacks"]
    assert summary["committed_steps"] > 0 and summary["epochs"] >= 1, summary
