"""scripts/horovod_suites.py, the runner of Horovod's own test files: the raw outputs it records
name no path of the machine, and a test that fails in a batch does not fail the tests after it."""

import importlib.util
import site
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

from conftest import REPO

spec = importlib.util.spec_from_file_location("horovod_suites",
                                              REPO / "scripts" / "horovod_suites.py")
suites = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suites)


def test_recorded_output_names_no_path_of_this_machine(tmp_path):
    checkout = tmp_path / "somewhere" / "horovod"
    scratch = tmp_path / "scratch_x"
    packages = Path(site.getsitepackages()[0])
    text = (f"{scratch}/parallel/test_torch.py:12\n{checkout}/test/parallel/x.py\n"
            f"{packages}/torch/optim/_muon.py:131: ValueError\n"
            f"{REPO}/src/horovodlike/torch/mpi_ops.py:40\n"
            f"{Path(sys.base_prefix)}/lib/thing.py\n{Path(tempfile.gettempdir())}/other\n")
    scrubbed = suites.scrubber(checkout, scratch)(text)
    assert scrubbed.splitlines() == [
        "path/to/scratch/parallel/test_torch.py:12", "path/to/horovod/test/parallel/x.py",
        "site-packages/torch/optim/_muon.py:131: ValueError",
        "path/to/horovodlike/src/horovodlike/torch/mpi_ops.py:40",
        "python-prefix/lib/thing.py", "tmp/other"], scrubbed


def test_tests_after_a_failure_in_a_batch_run_in_a_new_batch(monkeypatch):
    """The failure in test b leaves the ranks out of step in its batch, failing c there: b runs
    alone, c and d go on in a new batch, where c passes."""
    ids = ["t::a", "t::b", "t::c", "t::d"]
    batches, alone = [], []

    def run_batch(parallel, batch, args, flags):
        batches.append(list(batch))
        broken = False
        results = {}
        for test_id in batch:
            failed = test_id == "t::b" or broken
            broken = broken or failed
            results[test_id] = [("failed" if failed else "passed", "")] * args.np
        return results

    def run_one(parallel, test_id, args, flags):
        alone.append(test_id)
        return "failed", "its output"

    monkeypatch.setattr(suites, "run_batch", run_batch)
    monkeypatch.setattr(suites, "run_one", run_one)
    outcomes, rechecked = suites.run_tests(None, ids, Namespace(batch=0, np=2), [])
    assert batches == [ids, ["t::c", "t::d"]]
    assert alone == ["t::b"] and rechecked == 1
    assert {t: o for t, (o, _) in outcomes.items()} == {
        "t::a": "passed", "t::b": "failed", "t::c": "passed", "t::d": "passed"}
