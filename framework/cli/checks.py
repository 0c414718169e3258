"""Checks on the command line before Hydra composes anything.

Hydra already refuses a group option that has no YAML ("Could not find 'scheduler/foo'"); this
says the same in one line and adds what the registry knows: the installed plugins, and the
`scheduler.name=foo` spelling for a plugin that ships no YAML of its own.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from schedlab import registry


def group_options(group: str) -> list[str]:
    """The options Hydra sees for a config group (built-in YAML plus plugins' search paths)."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    was_initialized = GlobalHydra.instance().is_initialized()
    if was_initialized:
        return GlobalHydra.instance().config_loader().get_group_options(group)
    with initialize_config_module("schedlab.conf", version_base="1.3"):
        return GlobalHydra.instance().config_loader().get_group_options(group)


def installed(kind: str) -> list[str]:
    """Plugin names declared for an interface (entry-point metadata only, nothing imported)."""
    return sorted({ep.name for ep in entry_points(group=registry.all_groups()[kind])})


_DOTTED = re.compile(r"(?P<kind>\w+)=(?P<path>[\w.]+:[\w.]+)")


def rewrite_dotted(overrides: Sequence[str]) -> list[str]:
    """`scheduler=my_module:MyScheduler` -> `scheduler.name=my_module:MyScheduler`: a class on
    a dotted path has no YAML in the group, so it keeps the group's default `options: {}`, and
    its options are added: `scheduler.options.k=v` -> `++scheduler.options.k=v`."""
    dotted = set()
    kinds = registry.all_groups()
    for o in overrides:
        m = _DOTTED.fullmatch(o)
        if m and m["kind"] in kinds:
            dotted.add(m["kind"])
    out = []
    for o in overrides:
        m = _DOTTED.fullmatch(o)
        if m and m["kind"] in dotted:
            o = f"{m['kind']}.name={m['path']}"
        elif o.split(".", 1)[0] in dotted and o.split(".", 2)[1:2] == ["options"]:
            o = f"++{o}"
        out.append(o)
    return out


def check_group_choices(overrides: Sequence[str]) -> str | None:
    """A message for the first plugin-group choice with no config, or None when all are known."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        args, _ = get_args_parser().parse_known_args(list(overrides))
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra reports malformed arguments itself
        return None
    if args.config_dir or any(o.key_or_group.startswith("hydra.searchpath") for o in parsed):
        return None  # the search path changes here: leave the check to Hydra
    kinds = registry.all_groups()
    for o in parsed:
        kind = o.key_or_group
        if kind not in kinds or o.package is not None or o.is_delete():
            continue
        if o.is_sweep_override():
            try:
                values = list(o.sweep_string_iterator())
            except Exception:  # noqa: BLE001 - ranges, globs: leave them to Hydra
                continue
        else:
            values = [o.get_value_element_as_str()]
        options = group_options(kind)
        for value in values:
            if value in options or value == "null":
                continue
            plugins = installed(kind)
            msg = (f"{kind}={value!r} is not a {kind} config; configs: {', '.join(options)}; "
                   f"installed {kind} plugins: {', '.join(plugins) or 'none'}; or a class as "
                   f"{kind}=module:Class")
            if value in plugins:
                msg += (f". The plugin {value!r} is installed but ships no YAML for the "
                        f"{kind} group: run it as {kind}.name={value}")
            return msg
    return None


def prepare_overrides(overrides: Sequence[str]) -> list[str] | None:
    """What every Hydra-composed command does first: offline Hugging Face defaults, `KIND=
    module:Class` rewritten, group choices checked. None (after one printed line): refused."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bar
    overrides = rewrite_dotted(overrides)
    message = check_group_choices(overrides)
    if message is not None:
        print(f"schedlab: error: {message}", file=sys.stderr)
        return None
    return list(overrides)
