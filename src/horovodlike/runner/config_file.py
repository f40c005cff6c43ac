"""--config-file: horovodrun's YAML file of settings. Each setting's key is in the settings table
(settings.py); a setting given on the command line wins over the file."""

from __future__ import annotations

import argparse
import sys

from horovodlike.runner.settings import (CONFIG_CONTROLLER_KEY, CONFIG_SECTIONS, GLOO, MPI,
                                         SETTINGS, TRANSPORTS, Setting)


def _keys_by_section() -> dict[str, dict[str, Setting]]:
    sections: dict[str, dict[str, Setting]] = {section: {} for section in CONFIG_SECTIONS}
    for setting in SETTINGS:
        if setting.config:
            section, key = setting.config.split(".")
            sections[section][key] = setting
    return sections


def _load(path: str, parser: argparse.ArgumentParser) -> dict:
    try:
        import yaml
    except ImportError:
        parser.error("--config-file needs PyYAML: pip install pyyaml")
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except OSError as error:
        parser.error(f"--config-file {path}: {error.strerror}")
    except yaml.YAMLError as error:
        parser.error(f"--config-file {path} is not valid YAML: {error}")
    if not isinstance(config, dict):
        parser.error(f"--config-file {path}: expected a mapping of sections")
    return config


def apply_config_file(args, parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Fills in the settings of --config-file that the command line did not give."""
    if not args.config_file:
        return
    config = _load(args.config_file, parser)
    given = _given_on_command_line(parser, argv)
    if "no_autotune" in given:
        given.add("autotune")
    where = f"--config-file {args.config_file}"
    sections = _keys_by_section()
    unknown = sorted(set(config) - set(sections) - {CONFIG_CONTROLLER_KEY})
    if unknown:
        parser.error(f"{where}: unknown section(s) {', '.join(unknown)} (known: "
                     f"{CONFIG_CONTROLLER_KEY}, {', '.join(sections)})")
    _apply_controller(config.get(CONFIG_CONTROLLER_KEY), args, parser, where)
    for section, keys in sections.items():
        values = config.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            parser.error(f"{where}: section '{section}' must be a mapping")
        for key in sorted(set(values) - set(keys)):
            parser.error(f"{where}: unknown key '{section}.{key}' (known: "
                         f"{', '.join(sorted(keys))})")
        for key, setting in keys.items():
            if key in values and setting.name not in given:
                setattr(args, setting.name, _checked(setting, values[key], parser, where))


def _apply_controller(controller, args, parser, where: str) -> None:
    if controller is None or args.use_gloo or args.use_mpi:
        return
    name = str(controller).lower()
    if name not in TRANSPORTS:
        names = sorted(TRANSPORTS)
        parser.error(f"{where}: {CONFIG_CONTROLLER_KEY} must be {', '.join(names[:-1])} or "
                     f"{names[-1]}, got '{controller}'")
    args.use_gloo = name == GLOO
    args.use_mpi = name == MPI


def _checked(setting: Setting, value, parser, where: str):
    """`value` as the setting's type, or the parser's error naming the key."""
    kind = setting.value_type
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        parser.error(f"{where}: '{setting.config}' must be a {kind.__name__}, got {value!r}")
    if setting.choices is not None:
        if value.upper() not in setting.choices:
            parser.error(f"{where}: '{setting.config}' must be one of "
                         f"{', '.join(setting.choices)}, got '{value}'")
        return value.upper()
    return kind(value) if kind is float else value


def _given_on_command_line(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """Destinations of the options present on the command line (before the command)."""
    words = sys.argv[1:] if argv is None else argv
    given = set()
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of options
        for option in action.option_strings:
            for word in words:
                if word == "--" or not word.startswith("-"):
                    continue
                if word == option or word.startswith(option + "="):
                    given.add(action.dest)
    return given
