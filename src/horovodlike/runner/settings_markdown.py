"""docs/settings.md, written from the settings table (settings.py):

    python3 -m horovodlike.runner.settings_markdown > docs/settings.md

tests/test_settings.py fails when the committed page differs from what this prints."""

from __future__ import annotations

import sys

from horovodlike.runner.environment import format_number
from horovodlike.runner.settings import CONFIG_CONTROLLER_KEY, SETTINGS, TRANSPORTS, Setting

INTRO = """\
# Launcher settings

Every setting of `horovodlikerun` (and of its `horovodrun` flags): its command-line flags, its
key in the YAML file given to `--config-file`, the environment variables it gives every rank,
its type and its default. A flag given on the command line wins over the config file. A setting
"not set" gives the ranks no variable, so they use the variable the launcher was started with,
if any, else the core's default (given in the description where the launcher knows it).

The config file also takes `{controller}: {transports}` at its top level, the same as
`--gloo` or `--mpi` (`tcp` is the built-in transport, the default).

This page is generated from `src/horovodlike/runner/settings.py`:
`python3 -m horovodlike.runner.settings_markdown > docs/settings.md`.
"""


def _type(setting: Setting) -> str:
    if setting.action is not None:
        return "action"
    if setting.is_switch:
        return "switch"
    if setting.is_flag:
        return "flag"
    kind = setting.type.__name__
    if setting.nargs:
        kind = f"{setting.nargs} x {kind}"
    if setting.choices:
        kind += ": " + ", ".join(setting.choices)
    return kind


def _flags(setting: Setting) -> str:
    flags = list(setting.flags) + list(setting.negative)
    flags += [f"{flag} (deprecated)" for flag, _, _ in setting.deprecated]
    return "<br>".join(f"`{flag}`" for flag in flags)


def _help(setting: Setting) -> str:
    text = setting.help
    if setting.is_switch:
        text = f"{text}; `{setting.negative[0]}`: {setting.negative_help}"
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _default(setting: Setting) -> str:
    if setting.action is not None:
        return ""
    if setting.is_flag:
        return "off"
    if setting.default is None:
        return "not set"
    if isinstance(setting.default, float):
        return f"`{format_number(setting.default)}`"
    return f"`{setting.default}`"


def _row(setting: Setting) -> str:
    cells = [_flags(setting), f"`{setting.config}`" if setting.config else "",
             "<br>".join(f"`{name}`" for name in setting.env), _type(setting),
             _default(setting), _help(setting)]
    return "| " + " | ".join(cells) + " |"


def markdown() -> str:
    lines = [INTRO.format(controller=CONFIG_CONTROLLER_KEY,
                          transports=" | ".join(TRANSPORTS)).rstrip("\n")]
    groups: dict[str, list[Setting]] = {}
    for setting in SETTINGS:
        groups.setdefault(setting.group, []).append(setting)
    for group, settings in groups.items():
        title = group or "general"
        lines += ["", f"## {title[0].upper()}{title[1:]}", "",
                  "| Flags | Config file key | Environment variables | Type | Default | "
                  "What it does |", "|---|---|---|---|---|---|"]
        lines += [_row(setting) for setting in settings]
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
