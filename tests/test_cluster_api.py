"""horovodlike.ray and horovodlike.spark take Horovod's arguments, in Horovod's order and with its
defaults, so that a script written for horovod.ray or horovod.spark runs after changing its
import (positional calls included). Checked without starting an engine."""

import inspect

import pytest

from horovodlike.ray import ElasticRayExecutor, RayExecutor
import horovodlike.spark

EMPTY = inspect.Parameter.empty

# Horovod's signatures (horovod.ray.RayExecutor, ElasticRayExecutor, horovod.spark.run and
# run_elastic), leading parameters in order; ours may accept more after them.
HOROVOD = {
    "RayExecutor": (RayExecutor.__init__, [
        ("self", EMPTY), ("settings", EMPTY), ("num_workers", None), ("num_hosts", None),
        ("num_workers_per_host", 1), ("cpus_per_worker", 1), ("use_gpu", False),
        ("gpus_per_worker", None), ("use_current_placement_group", True)]),
    "RayExecutor.create_settings": (RayExecutor.create_settings, [
        ("timeout_s", 30), ("ssh_identity_file", None), ("ssh_str", None),
        ("placement_group_timeout_s", 100), ("nics", None)]),
    "RayExecutor.start": (RayExecutor.start, [
        ("self", EMPTY), ("executable_cls", None), ("executable_args", None),
        ("executable_kwargs", None), ("extra_env_vars", None)]),
    "RayExecutor.run": (RayExecutor.run, [
        ("self", EMPTY), ("fn", EMPTY), ("args", None), ("kwargs", None),
        ("callbacks", None)]),
    "RayExecutor.run_remote": (RayExecutor.run_remote, [
        ("self", EMPTY), ("fn", EMPTY), ("args", None), ("kwargs", None)]),
    "RayExecutor.execute": (RayExecutor.execute, [
        ("self", EMPTY), ("fn", EMPTY), ("callbacks", None)]),
    "RayExecutor.execute_single": (RayExecutor.execute_single, [
        ("self", EMPTY), ("fn", EMPTY)]),
    "RayExecutor.shutdown": (RayExecutor.shutdown, [("self", EMPTY)]),
    "ElasticRayExecutor": (ElasticRayExecutor.__init__, [
        ("self", EMPTY), ("settings", EMPTY), ("use_gpu", False), ("cpus_per_slot", 1),
        ("gpus_per_slot", None), ("env_vars", None), ("override_discovery", True)]),
    "ElasticRayExecutor.create_settings": (ElasticRayExecutor.create_settings, [
        ("min_num_proc", 1), ("max_num_proc", None), ("reset_limit", None),
        ("elastic_timeout", 600), ("timeout_s", 30), ("ssh_identity_file", None),
        ("nics", None), ("min_np", None), ("max_np", None)]),
    "ElasticRayExecutor.run": (ElasticRayExecutor.run, [
        ("self", EMPTY), ("worker_fn", EMPTY), ("callbacks", None)]),
    "spark.run": (horovodlike.spark.run, [
        ("fn", EMPTY), ("args", ()), ("kwargs", {}), ("num_proc", None),
        ("start_timeout", None), ("use_mpi", None), ("use_gloo", None),
        ("extra_mpi_args", None), ("env", None), ("stdout", None), ("stderr", None),
        ("verbose", 1), ("nics", None), ("prefix_output_with_timestamp", False),
        ("executable", None)]),
    # Horovod names the 5th and 6th min_np and max_np (min_num_proc and max_num_proc in its
    # Ray API); both names are taken, and the positions are the same.
    "spark.run_elastic": (horovodlike.spark.run_elastic, [
        ("fn", EMPTY), ("args", ()), ("kwargs", {}), ("num_proc", None),
        ("min_num_proc", None), ("max_num_proc", None), ("start_timeout", None),
        ("elastic_timeout", None), ("reset_limit", None), ("env", None), ("stdout", None),
        ("stderr", None), ("verbose", 1), ("nics", None),
        ("prefix_output_with_timestamp", False), ("min_np", None), ("max_np", None)]),
}


@pytest.mark.parametrize("name", sorted(HOROVOD))
def test_signature_is_horovods(name):
    function, expected = HOROVOD[name]
    got = [(p.name, p.default) for p in inspect.signature(function).parameters.values()
           if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert got[:len(expected)] == expected, f"{name}: {got}"
