"""scripts/horovod_suites.py, the runner of Horovod's own test files: the raw outputs it records
name no path of the machine, and a test that fails in a batch does not fail the tests after it."""

import importlib.util
import json
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


def test_a_failure_in_a_batch_reruns_the_failed_tests_alone_and_keeps_the_passes(monkeypatch):
    """The failure in test b leaves the ranks out of step, failing c in the same batch: b and c
    run alone, and that decides (c passes there); d passed on every rank after them and keeps
    its pass. One batch in all."""
    ids = ["t::a", "t::b", "t::c", "t::d"]
    batches, alone = [], []

    def run_batch(parallel, batch, args, flags):
        batches.append(list(batch))
        outcome = {"t::b": "failed", "t::c": "failed"}
        return {t: [(outcome.get(t, "passed"), "")] * args.np for t in batch}

    def run_one(parallel, test_id, args, flags):
        alone.append(test_id)
        return ("failed" if test_id == "t::b" else "passed"), "its output"

    monkeypatch.setattr(suites, "run_batch", run_batch)
    monkeypatch.setattr(suites, "run_one", run_one)
    outcomes, rechecked = suites.run_tests(None, ids, Namespace(batch=0, np=2, progress=False),
                                           [])
    assert batches == [ids]
    assert alone == ["t::b", "t::c"] and rechecked == 2
    assert {t: o for t, (o, _) in outcomes.items()} == {
        "t::a": "passed", "t::b": "failed", "t::c": "passed", "t::d": "passed"}


def test_failures_in_a_row_send_the_rest_to_a_new_batch(monkeypatch):
    """b fails and leaves the ranks out of step: c, d fail after it in the same batch. b runs
    alone; c on goes to a new batch, where c and d pass (so a cascade costs one batch, not a
    test alone each)."""
    ids = ["t::a", "t::b", "t::c", "t::d", "t::e"]
    batches, alone = [], []

    def run_batch(parallel, batch, args, flags):
        batches.append(list(batch))
        broken = set(batch[1:4]) if batch == ids else set()
        return {t: [("failed" if t in broken else "passed", "")] * args.np for t in batch}

    def run_one(parallel, test_id, args, flags):
        alone.append(test_id)
        return "failed", "its output"

    monkeypatch.setattr(suites, "run_batch", run_batch)
    monkeypatch.setattr(suites, "run_one", run_one)
    outcomes, rechecked = suites.run_tests(None, ids, Namespace(batch=0, np=2, progress=False),
                                           [])
    assert batches == [ids, ["t::c", "t::d", "t::e"]]
    assert alone == ["t::b"] and rechecked == 1
    assert {t: o for t, (o, _) in outcomes.items()} == {
        "t::a": "passed", "t::b": "failed", "t::c": "passed", "t::d": "passed", "t::e": "passed"}


def test_a_batch_that_ends_in_a_test_goes_on_in_a_new_batch(monkeypatch):
    """Rank 1 never reports c (the job died in it): c runs alone, and what had not run after it
    goes on (here d, alone)."""
    ids = ["t::a", "t::b", "t::c", "t::d"]
    batches, alone = [], []

    def run_batch(parallel, batch, args, flags):
        batches.append(list(batch))
        results = {t: [("passed", "")] * args.np for t in batch}
        if "t::c" in results:
            results["t::c"] = [("passed", "")]
            results.pop("t::d")
        return results

    def run_one(parallel, test_id, args, flags):
        alone.append(test_id)
        return "failed", "its output"

    monkeypatch.setattr(suites, "run_batch", run_batch)
    monkeypatch.setattr(suites, "run_one", run_one)
    outcomes, _ = suites.run_tests(None, ids, Namespace(batch=0, np=2, progress=False), [])
    # What is left after the batch's end is one test, which runs alone rather than as a batch.
    assert batches == [ids] and alone == ["t::c", "t::d"]
    assert {t: o for t, (o, _) in outcomes.items()} == {
        "t::a": "passed", "t::b": "passed", "t::c": "failed", "t::d": "failed"}


def test_expectations_fail_on_a_test_that_stops_passing_and_say_so_on_one_that_starts():
    expected = {"np": 2, "passed": ["a", "b"], "skipped": ["c"], "failed": ["d"]}
    same = {"a": "passed", "b": "passed", "c": "skipped", "d": "failed"}
    assert suites.compare(expected, same) == ([], [])
    regressions, improvements = suites.compare(expected, {**same, "a": "skipped", "d": "passed"})
    assert regressions == ["a: passed -> skipped"] and improvements == ["d: failed -> passed"]
    regressions, _ = suites.compare(expected, {**same, "a": "failed"})
    assert regressions == ["a: passed -> failed", "1 passed, fewer than the 2 expected"]
    regressions, _ = suites.compare(expected, {**same, "c": "failed", "e": "skipped"})
    assert regressions == ["c: skipped -> failed", "e: new test -> skipped"]
    regressions, improvements = suites.compare(expected, {"a": "passed", "c": "skipped",
                                                          "d": "failed", "e": "passed"})
    assert regressions == ["b: passed -> gone from the suite"] and improvements == [
        "e: new test -> passed"]


def test_check_expectations_says_update_the_expectations_when_tests_do_better():
    expected = {"test_torch.py": {"gloo": {"np": 2, "passed": ["a"], "skipped": ["b"],
                                           "failed": []}}}
    said = []
    args = Namespace(gloo=True, mpi=False, np=2)
    assert suites.check_expectations(expected, {"test_torch.py": {"a": "passed", "b": "passed"}},
                                     args, said.append)
    assert any("Update the expectations" in line for line in said), said
    said.clear()
    assert not suites.check_expectations(expected, {"test_torch.py": {"a": "failed",
                                                                      "b": "skipped"}},
                                         args, said.append)
    assert "REGRESSION a: passed -> failed" in said[0], said
    said.clear()
    assert not suites.check_expectations(expected, {"test_torch.py": {"a": "passed"}},
                                         Namespace(gloo=False, mpi=True, np=2), said.append)
    assert "none for test_torch.py on the mpi transport" in said[0], said


def test_expectations_on_more_ranks_are_kept_apart_from_those_on_two(tmp_path):
    path = tmp_path / "expected.json"
    two, four = Namespace(gloo=False, mpi=False, np=2), Namespace(gloo=False, mpi=False, np=4)
    suites.update_expectations(path, {"test_torch.py": {"a": "passed", "b": "failed"}}, two)
    suites.update_expectations(path, {"test_torch.py": {"a": "passed", "b": "passed"}}, four)
    expected = json.loads(path.read_text())
    assert expected["test_torch.py"]["default"]["failed"] == ["b"]
    assert expected["test_torch.py"]["default np4"] == {"np": 4, "passed": ["a", "b"],
                                                        "skipped": [], "failed": []}
    said = []
    # b passes on 4 ranks; the 2-rank entry, where it fails, is not the one judged.
    assert suites.check_expectations(expected, {"test_torch.py": {"a": "passed",
                                                                  "b": "passed"}},
                                     four, said.append)
    assert said == ["EXPECTATIONS: test_torch.py on the default transport as expected"], said
    said.clear()
    assert not suites.check_expectations(expected, {"test_torch.py": {"a": "passed"}},
                                         Namespace(gloo=False, mpi=False, np=3), said.append)
    assert "none for test_torch.py on the default transport with -np 3" in said[0], said


def test_the_committed_expectations_cover_three_transports_and_fail_only_known_tests():
    expected = json.loads(suites.EXPECTATIONS.read_text())
    torch_suite = expected["test_torch.py"]
    assert sorted(torch_suite) == ["default", "default np4", "gloo", "mpi"]
    assert torch_suite["default np4"]["np"] == 4
    assert all(torch_suite[t]["np"] == 2 for t in ("default", "gloo", "mpi"))
    for transport, entry in torch_suite.items():
        names = entry["passed"] + entry["skipped"] + entry["failed"]
        assert len(names) == len(set(names)), transport
        assert set(entry["failed"]) <= set(suites.KNOWN_FAILURES["test_torch.py"]), transport
    assert len(torch_suite["default"]["passed"]) >= 102


def test_ci_requires_the_horovod_suites_and_both_transports():
    script = (REPO / ".ci" / "run").read_text()
    assert "horovod-tests" in script and "--expect" in script and "--np 4" in script
    for transport in ("--gloo", "--mpi"):
        assert transport in script
    required = [line for line in script.splitlines()
                if "HOROVODLIKE_REQUIRE_TRANSPORTS=gloo,mpi" in line]
    assert required and all(not line.startswith(" ") for line in required), required


def test_known_failures_run_alone_from_the_start(monkeypatch):
    """A known failure would end every batch it was in, and the tests after it would run again
    in a new one: it runs alone, the others in one batch."""
    ids = ["t::a", "t::known", "t::c"]
    batches, alone = [], []

    def run_batch(parallel, batch, args, flags):
        batches.append(list(batch))
        return {test_id: [("passed", "")] * args.np for test_id in batch}

    def run_one(parallel, test_id, args, flags):
        alone.append(test_id)
        return "failed", "its output"

    monkeypatch.setattr(suites, "run_batch", run_batch)
    monkeypatch.setattr(suites, "run_one", run_one)
    outcomes, ran_alone = suites.run_tests(None, ids, Namespace(batch=0, np=2), [],
                                           alone_first={"t::known"})
    assert batches == [["t::a", "t::c"]] and alone == ["t::known"] and ran_alone == 1
    assert outcomes["t::known"][0] == "failed" and outcomes["t::c"][0] == "passed"
