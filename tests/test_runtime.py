"""The runtime's life cycle and memory, with real processes: init under threads, shutdown
racing a caller, the fusion buffer shrinking."""

from conftest import assert_all_ranks, launch


def test_runtime_lifecycle_under_threads_and_fusion_buffer_shrinks(tmp_path):
    result = launch(2, "runtime_worker.py", env={"RUNTIME_WORKER_DIR": str(tmp_path)},
                    timeout=120)
    assert_all_ranks(result, 2, "runtime OK")
