"""The launcher's settings table (horovodlike/runner/settings.py): docs/settings.md is what it
generates, the transports' names are the core's, and the parser, the config file and the ranks'
environment all follow the table."""

import re
import subprocess
import sys

import pytest

from conftest import REPO, job_env
from horovodlike.runner import launch
from horovodlike.runner.cluster_job import start_rendezvous
from horovodlike.runner.config_file import apply_config_file
from horovodlike.runner.environment import job_environment
from horovodlike.runner.settings import SETTINGS, TRANSPORTS, rank_environment
from horovodlike.runner.settings_markdown import markdown


def test_docs_settings_page_is_generated_from_the_table():
    committed = (REPO / "docs" / "settings.md").read_text()
    assert committed == markdown(), (
        "docs/settings.md is stale: python3 -m horovodlike.runner.settings_markdown "
        "> docs/settings.md")


def test_the_transports_are_the_ones_the_core_accepts():
    """The core's own error for an unknown HOROVOD_CPU_OPERATIONS lists its names."""
    probe = ("import horovodlike._core as core\n"
             "try:\n    core.init()\nexcept ValueError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, cwd=REPO,
                            env=job_env({"HOROVOD_CPU_OPERATIONS": "no-such-transport"}))
    found = re.search(r"is not one of ([a-z, ]+)$", result.stdout.strip())
    assert found, result.stdout + result.stderr
    assert tuple(found.group(1).split(", ")) == TRANSPORTS


def test_every_flag_and_config_key_belongs_to_one_setting():
    flags = [flag for s in SETTINGS for flag in (*s.flags, *s.negative)]
    flags += [flag for s in SETTINGS for flag, _, _ in s.deprecated]
    assert len(flags) == len(set(flags))
    keys = [s.config for s in SETTINGS if s.config]
    assert len(keys) == len(set(keys))
    parser = launch.make_parser()
    parsed = {option for action in parser._actions for option in action.option_strings}
    assert parsed == set(flags) | {"-h", "--help"}


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.env_value is not None],
                         ids=lambda s: s.name)
def test_each_setting_sets_only_its_own_variables(setting):
    value = {int: 3, float: 2.5, str: "0,1"}.get(setting.type, True)
    if setting.choices:
        value = setting.choices[0]
    env = setting.rank_environment(value)
    assert env and set(env) == set(setting.env)
    assert set(rank_environment({setting.name: value})) == set(setting.env)
    assert setting.rank_environment(None) == {}


def test_every_config_key_sets_its_setting(tmp_path):
    values = {bool: True, int: 4, float: 1.5, str: "INFO"}
    sections = {}
    for s in SETTINGS:
        if s.config:
            section, key = s.config.split(".")
            sections.setdefault(section, {})[key] = values[s.value_type]
    path = tmp_path / "settings.yaml"
    path.write_text("\n".join(f"{section}:\n" + "".join(f"  {k}: {v}\n" for k, v in keys.items())
                              for section, keys in sections.items()).replace("True", "true"))
    argv = ["-np", "2", "--config-file", str(path), "python", "x.py"]
    parser = launch.make_parser()
    args = parser.parse_args(argv)
    apply_config_file(args, parser, argv)
    for s in SETTINGS:
        if s.config:
            assert getattr(args, s.name) == values[s.value_type], s.name


def test_the_ranks_environment_comes_from_the_settings():
    args = launch.make_parser().parse_args(
        ["-np", "2", "--gloo", "--fusion-threshold-mb", "1.5", "--cache-capacity", "9",
         "--disable-cache", "--no-stall-check", "python", "x.py"])
    env = job_environment(launch._job_settings(args, "127.0.0.1", 1234, "ab", 30.0))
    assert env["HOROVOD_CPU_OPERATIONS"] == env["HOROVOD_CONTROLLER"] == "gloo"
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(3 * 1024 * 1024 // 2)
    assert env["HOROVOD_CACHE_CAPACITY"] == "0"  # --disable-cache wins
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert env["HOROVOD_START_TIMEOUT"] == "30"


def test_cluster_jobs_take_settings_by_name():
    server, job = start_rendezvous("127.0.0.1", 5.0, use_gloo=True, network_interface="lo")
    server.stop()
    env = job_environment(job)
    assert env["HOROVOD_CPU_OPERATIONS"] == "gloo" and env["HOROVOD_GLOO_IFACE"] == "lo"
    with pytest.raises(TypeError, match="unknown setting.*cpu_operations"):
        start_rendezvous("127.0.0.1", 5.0, cpu_operations="gloo")
