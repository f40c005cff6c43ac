"""The launcher's argparse parser, made from the settings table (settings.py)."""

from __future__ import annotations

import argparse

from horovodlike.runner.settings import SETTINGS, Setting

DESCRIPTION = "Starts a horovodlike job: N copies of a command, one per rank."
USAGE = "%(prog)s -np N [-H host1:4,host2:4 | --hostfile FILE] [options] command ..."


def package_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("horovodlike")
    except (ImportError, PackageNotFoundError):
        pass
    try:
        import horovodlike
        return getattr(horovodlike, "__version__", "unknown")
    except ImportError:
        return "unknown"


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(package_version())
        parser.exit()


def _deprecated(replacement: str):
    """An argparse action storing its const and warning, as horovodrun does, that the flag has
    been replaced."""
    class Deprecated(argparse.Action):
        def __init__(self, option_strings, dest, const=None, help=None, **_):
            super().__init__(option_strings, dest, nargs=0, const=const, help=help)

        def __call__(self, parser, namespace, values, option_string=None):
            namespace.notices_early = getattr(namespace, "notices_early", []) + [
                f"{option_string} is deprecated (Horovod replaced it with {replacement}); it "
                f"works as {replacement}"]
            setattr(namespace, self.dest, self.const)

    return Deprecated


_ACTIONS = {"version": _VersionAction}


def _add(container, setting: Setting) -> None:
    if setting.action is not None:
        container.add_argument(*setting.flags, action=_ACTIONS[setting.action], help=setting.help)
    elif setting.is_switch:
        container.add_argument(*setting.flags, dest=setting.name, action="store_const",
                               const=True, help=setting.help)
        container.add_argument(*setting.negative, dest=setting.name, action="store_const",
                               const=False, help=setting.negative_help)
        for flag, value, replacement in setting.deprecated:
            container.add_argument(flag, dest=setting.name, action=_deprecated(replacement),
                                   const=value, help=argparse.SUPPRESS)
    elif setting.is_flag:
        container.add_argument(*setting.flags, dest=setting.name, action="store_true",
                               help=setting.help)
    else:
        extra = {key: value for key, value in (("choices", setting.choices),
                                               ("metavar", setting.metavar),
                                               ("nargs", setting.nargs),
                                               ("default", setting.default))
                 if value is not None}
        if setting.type is not str:
            extra["type"] = setting.type
        container.add_argument(*setting.flags, dest=setting.name, help=setting.help, **extra)


def make_parser(prog: str = "horovodlikerun") -> argparse.ArgumentParser:
    """Every setting's flags in --help sections in table order, then the command."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, usage=USAGE)
    groups: dict[str, argparse._ArgumentGroup] = {}
    exclusive: dict[tuple[str, str], argparse._MutuallyExclusiveGroup] = {}
    for setting in SETTINGS:
        if setting.group and setting.group not in groups:
            groups[setting.group] = parser.add_argument_group(setting.group)
        container = groups[setting.group] if setting.group else parser
        if setting.exclusive:
            key = (setting.group, setting.exclusive)
            if key not in exclusive:
                exclusive[key] = container.add_mutually_exclusive_group()
            container = exclusive[key]
        elif setting.is_switch:
            container = container.add_mutually_exclusive_group()
        _add(container, setting)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser
