"""The Horovod timeline: rank 0 writes a Chrome trace with a row per tensor, NEGOTIATE_<OP> then
the operation and its activities, from HOROVOD_TIMELINE (or --timeline-filename) or between
start_timeline() and stop_timeline()."""

import json
import subprocess
import sys

from conftest import assert_all_ranks, job_env, launch

WORKER = "timeline_worker.py"


def read_trace(path):
    """The events of a trace; a file cut off by a kill may lack its final bracket."""
    text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.rstrip().rstrip(",") + "]")


def rows_of(events):
    """{tensor name: [its B/E events in file order]}, checking that each row is well formed:
    one name per row, begins and ends balanced and nested, timestamps never going back. Row 0
    holds the cycle marks, if any."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names.pop(0, "CYCLE_START") == "CYCLE_START"
    assert len(set(names.values())) == len(names), names
    rows = {}
    for pid, name in names.items():
        row = [e for e in events if e["pid"] == pid and e["ph"] in "BE"]
        stack, last = [], -1
        for e in row:
            assert e["ts"] >= last, (name, e)
            last = e["ts"]
            if e["ph"] == "B":
                stack.append(e)
            else:
                assert stack, f"'{name}': an end without a begin at {e['ts']}"
                assert e["ts"] - stack.pop()["ts"] >= 0
        assert not stack, f"'{name}': {[b['name'] for b in stack]} never ended"
        rows[name] = row
    return rows


def phases(row):
    """[(depth, phase name)] of the begins of a row."""
    out, depth = [], 0
    for e in row:
        if e["ph"] == "B":
            out.append((depth, e["name"]))
            depth += 1
        else:
            depth -= 1
    return out


def test_every_tensor_has_its_row_with_negotiation_and_operation(tmp_path):
    trace = tmp_path / "timeline.json"
    result = launch(2, WORKER, "env", tmp_path, env={"HOROVOD_TIMELINE": str(trace)})
    assert_all_ranks(result, 2, "done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.json"]  # rank 0 only
    events = read_trace(trace)
    assert trace.read_text().rstrip().endswith("]")  # closed cleanly by shutdown()
    rows = rows_of(events)
    # Rows are titled "<op>.<name>", as Horovod titles them.
    expected = {"allreduce.solo": "ALLREDUCE", "allreduce.fused.0": "ALLREDUCE",
                "allreduce.fused.1": "ALLREDUCE", "allreduce.fused.2": "ALLREDUCE",
                "allgather.gathered": "ALLGATHER", "broadcast.broadcasted": "BROADCAST"}
    assert set(rows) == set(expected), sorted(rows)
    for name, op in expected.items():
        top = [p for depth, p in phases(rows[name]) if depth == 0]
        # Three calls, the later two through the response cache: each negotiated, then run.
        assert top == [f"NEGOTIATE_{op}", op] * 3, (name, top)
        nested = {p for depth, p in phases(rows[name]) if depth == 1}
        assert nested, (name, phases(rows[name]))
    for i in range(3):
        assert {"MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"} <= \
            {p for _, p in phases(rows[f"allreduce.fused.{i}"])}
    assert any(p.endswith("_ALLREDUCE") for _, p in phases(rows["allreduce.solo"]))
    assert ("MEMCPY_IN_FUSION_BUFFER" not in {p for _, p in phases(rows["allreduce.solo"])})
    # The ring's label names the link it ran over (SHM_, TCP_, GLOO_, MPI_RING_ALLGATHER).
    assert any(depth == 1 and p.endswith("_RING_ALLGATHER")
               for depth, p in phases(rows["allgather.gathered"]))
    assert any(depth == 1 and p.endswith("_CHAIN_BROADCAST")
               for depth, p in phases(rows["broadcast.broadcasted"]))
    assert not any(e["ph"] == "i" for e in events)  # no cycle marks unless asked


def test_launcher_flags_and_cycle_marks(tmp_path):
    trace = tmp_path / "cycles.json"
    result = launch(2, WORKER, "env", tmp_path,
                    launcher_args=["--timeline-filename", str(trace), "--timeline-mark-cycles"])
    assert_all_ranks(result, 2, "done")
    events = read_trace(trace)
    rows_of(events)
    marks = [e for e in events if e["ph"] == "i"]
    assert marks and all(e["name"] == "CYCLE_START" for e in marks)
    assert [e["ts"] for e in marks] == sorted(e["ts"] for e in marks)


def test_start_and_stop_at_run_time(tmp_path):
    result = launch(2, WORKER, "runtime", tmp_path)
    assert_all_ranks(result, 2, "done")
    # Rank 1 was asked too, with paths of its own: only rank 0 records, as in Horovod.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.rank0.json",
                                                          "second.rank0.json"]
    first = read_trace(tmp_path / "first.rank0.json")
    rows = rows_of(first)
    assert set(rows) == {"allreduce.during_first"}
    assert [p for d, p in phases(rows["allreduce.during_first"]) if d == 0] == \
        ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"] * 2
    assert not any(e["ph"] == "i" for e in first)
    second = read_trace(tmp_path / "second.rank0.json")
    assert set(rows_of(second)) == {"allreduce.during_second"}
    assert any(e["ph"] == "i" and e["name"] == "CYCLE_START" for e in second)


def test_unwritable_path_is_a_clear_error(tmp_path):
    result = launch(2, WORKER, "bad-path", tmp_path)
    assert_all_ranks(result, 2, "done")
    bad = str(tmp_path / "no-such-directory" / "timeline.json")
    assert f"[0]<stdout>:rank 0: ValueError: cannot write the timeline to '{bad}'" \
        in result.stdout, result.stdout
    assert "[1]<stdout>:rank 1: no error" in result.stdout  # rank 1 records nothing

    # The same path in HOROVOD_TIMELINE fails init() on rank 0, naming the variable and path.
    result = launch(2, WORKER, "env", tmp_path, env={"HOROVOD_TIMELINE": bad}, timeout=240)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"HOROVOD_TIMELINE: cannot write the timeline to '{bad}'" in output, output[-3000:]


def test_mark_cycles_flag_needs_a_file():
    result = subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "-np", "1",
                             "--timeline-mark-cycles", sys.executable, "-c", "pass"],
                            env=job_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 2
    assert "--timeline-mark-cycles needs --timeline-filename" in result.stderr
