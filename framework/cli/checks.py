"""Checks on the command line before Hydra composes anything.

Hydra already refuses a group option that has no YAML ("Could not find 'scheduler/foo'"); this
says the same in one line and adds what the registry knows: the installed plugins, and the
`scheduler.name=foo` spelling for a plugin that ships no YAML of its own. Likewise an override
of a key the composed config lacks (Hydra's "Key 'foo' is not in struct"): one line naming the
key and what is accepted there (`schedlab.cli.config_keys.accepted_keys`).
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any

from schedlab import registry


@contextmanager
def _hydra_conf() -> Iterator[Any]:
    """Hydra initialised on schedlab's configs (as it is, when it already is): its loader."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        yield GlobalHydra.instance().config_loader()
        return
    with initialize_config_module("schedlab.conf", version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


def group_options(group: str) -> list[str]:
    """The options Hydra sees for a config group (built-in YAML plus plugins' search paths)."""
    with _hydra_conf() as loader:
        return loader.get_group_options(group)


def _parse(overrides: Sequence[str]) -> list[Any] | None:
    """The overrides as Hydra parses them; None where Hydra should speak for itself (malformed
    arguments, or a config search path changed on the command line)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        args, _ = get_args_parser().parse_known_args(list(overrides))
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra reports malformed arguments itself
        return None
    if args.config_dir or any(o.key_or_group.startswith("hydra.searchpath") for o in parsed):
        return None  # the search path changes here: leave the check to Hydra
    return parsed


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


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def check_group_choices(overrides: Sequence[str]) -> str | None:
    """A message for the first config-group choice with no config (`hardware=`, `model=`,
    `workload=`, `experiment=`, ...; a plugin group's with the installed plugins), or None
    when all are known."""
    parsed = _parse(overrides)
    if parsed is None:
        return None
    kinds = registry.all_groups()
    for o in parsed:
        group = o.key_or_group
        if o.package is not None or o.is_delete() or "." in group or group.startswith("hydra"):
            continue  # a key, not a group; Hydra's own groups speak for themselves
        options = group_options(group)
        if not options and group not in kinds:
            continue
        try:
            values = (list(o.sweep_string_iterator()) if o.is_sweep_override()
                      else [o.get_value_element_as_str()])
        except Exception:  # noqa: BLE001 - ranges, globs: leave them to Hydra
            continue
        value = next((v for v in values if v not in options and v != "null"), None)
        if value is None:
            continue
        msg = f"{group}={value!r} is not {_a(group)} config; configs: {', '.join(options)}"
        if group in kinds:
            plugins = installed(group)
            msg += (f"; installed {group} plugins: {', '.join(plugins) or 'none'}; or a class "
                    f"as {group}=module:Class")
            if value in plugins:
                msg += (f". The plugin {value!r} is installed but ships no YAML for the "
                        f"{group} group: run it as {group}.name={value}")
        return msg
    return None


#: most combinations of swept group choices composed to check the keys (beyond: the first)
MAX_COMPOSITIONS = 16


def check_override_keys(overrides: Sequence[str]) -> str | None:
    """A message for the first override of a key that is not in the composed config (which
    Hydra refuses: an unknown key, or one a config leaves out, added with `+`), or None.

    The config is composed with the command line's group choices (each combination of swept
    ones, up to `MAX_COMPOSITIONS`), then the key overrides are walked in order, as Hydra
    applies them.
    """
    from hydra import compose
    from omegaconf import OmegaConf

    parsed = _parse(overrides)
    if parsed is None:
        return None
    with _hydra_conf() as loader:
        groups, keys = [], []
        for o in parsed:
            is_group = loader.repository.group_exists(o.key_or_group)
            if is_group and not (not o.is_sweep_override() and isinstance(o.value(), dict)):
                groups.append(o)
            elif not o.key_or_group.startswith("hydra.") and o.key_or_group != "hydra":
                keys.append(o)
        choices = [_group_choices(o) for o in groups]
        combos = list(itertools.islice(itertools.product(*choices), MAX_COMPOSITIONS + 1))
        if len(combos) > MAX_COMPOSITIONS:
            combos = [tuple(c[0] for c in choices)]
        for combo in combos:
            try:
                cfg = compose("config", overrides=list(combo))
            except Exception:  # noqa: BLE001 - a config that does not compose: Hydra says why
                return None
            for o in keys:
                plain = not (o.is_add() or o.is_force_add() or o.is_delete())
                if plain and o.package is None:
                    message = _missing_key(cfg, o)
                    if message is not None:
                        return message
                if o.is_sweep_override() or o.is_delete():
                    continue  # NOTE: a job's value: the key is all that matters here
                try:  # as Hydra applies it, so the overrides after it see its keys
                    OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True,
                                     force_add=not plain)
                except Exception:  # noqa: BLE001 - Hydra reports a bad override itself
                    return None
    return None


def _group_choices(o: Any) -> list[str]:
    """A group override as one or more plain overrides (one per value swept)."""
    if not o.is_sweep_override():
        return [o.input_line]
    try:
        return [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
    except Exception:  # noqa: BLE001 - ranges, globs: the first spelling Hydra takes
        return [o.input_line]


def _missing_key(cfg: Any, o: Any) -> str | None:
    """The sentence for a plain override `o` of a key `cfg` lacks; None when the key is there
    (or Hydra decides: below a list, a value or a null, which Hydra fills in)."""
    from omegaconf import DictConfig, OmegaConf

    from schedlab.cli.config_keys import accepted_keys

    parts = o.key_or_group.split(".")
    node, depth = cfg, 0
    for part in parts:
        if not isinstance(node, DictConfig):
            return None
        if part not in node.keys():
            break
        if OmegaConf.is_interpolation(node, part):
            return None  # NOTE: what it points to is Hydra's to follow
        node = OmegaConf.select(node, part, throw_on_missing=False)
        depth += 1
    else:
        return None
    path, key = ".".join(parts[:depth]), ".".join(parts[:depth + 1])
    accepted = accepted_keys(path, node)
    if accepted is None:
        return (f"{key} is not in the composed config; {path} takes keys of its own: add it "
                f"with +{o.input_line}")
    options = group_options(key) if not path else []
    if options:  # NOTE: an optional group left null (hardware): its node is not there
        return (f"{key} is not in the composed config (no {key} chosen); choose one: "
                f"{key}={', '.join(options)}; or add the key with +{o.input_line}")
    if part in accepted:
        return f"{key} is not in the composed config; add it with +{o.input_line}"
    where = path or "the config"
    if path == "workload":
        where = f"a type={node.get('type', 'synthetic')} workload"
    absent = [k for k in accepted if k not in node.keys()] if path else []
    added = (f" (a key this config leaves out is added with +, e.g. +{path}.{absent[0]}=...)"
             if absent else "")
    return f"{key} is not a key of {where}; accepted: {', '.join(accepted)}{added}"


def drop_carried_keys(overrides: Sequence[str]) -> list[str]:
    """`workload.output_len.dist=uniform` (or `workload.output_len={dist: uniform, ...}`, which
    Hydra merges too) on a spec the config gives another dist: the keys the config set there
    that uniform does not read (an experiment's lognormal `mean`, `sigma`) are dropped, one
    `~workload.output_len.sigma` appended for each. A key the command line sets stays (and is
    checked); a swept switch is left as it is (the check names what to drop)."""
    from hydra import compose
    from omegaconf import DictConfig, OmegaConf

    from schedlab.runs.distributions import LENGTH_DIST_KEYS, SECONDS_DIST_KEYS, dist_keys
    from schedlab.runs.workload import LENGTH_NODES

    parsed = _parse(overrides)
    if parsed is None or any(o.is_sweep_override() for o in parsed):
        return list(overrides)
    specs = {f"workload.{n}" for n in (*LENGTH_NODES, "think_time_s")}
    switched: dict[str, dict[str, Any]] = {}  # spec path -> the keys the command line sets
    for o in parsed:
        key, value = o.key_or_group, None if o.is_delete() else o.value()
        path, _, leaf = key.rpartition(".")
        if o.package is not None:
            continue
        if key in specs and isinstance(value, dict):
            switched.setdefault(key, {}).update(value)
        elif path in specs:
            switched.setdefault(path, {})[leaf] = value
    if not any("dist" in given for given in switched.values()):
        return list(overrides)
    with _hydra_conf() as loader:
        groups = [o.input_line for o in parsed if loader.repository.group_exists(o.key_or_group)
                  and not isinstance(o.value(), dict)]
        try:
            cfg = compose("config", overrides=groups)
        except Exception:  # noqa: BLE001 - a config that does not compose: Hydra says why
            return list(overrides)
    out = list(overrides)
    for path, given in switched.items():
        node = OmegaConf.select(cfg, path, throw_on_missing=False)
        if not isinstance(node, DictConfig) or "dist" not in given:
            continue
        table = SECONDS_DIST_KEYS if path.endswith("think_time_s") else LENGTH_DIST_KEYS
        keys = [str(k) for k in node]
        accepted = dist_keys({**dict.fromkeys(keys), **given}, table)
        out += [f"~{path}.{k}" for k in keys if accepted is not None and k not in accepted
                and k not in given]
    return out


def prepare_overrides(overrides: Sequence[str]) -> list[str] | None:
    """What every Hydra-composed command does first: offline Hugging Face defaults, `KIND=
    module:Class` rewritten, group choices and overridden keys checked. None (after one
    printed line): refused."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bar
    overrides = rewrite_dotted(overrides)
    message = check_group_choices(overrides) or check_override_keys(overrides)
    if message is not None:
        print(f"schedlab: error: {message}", file=sys.stderr)
        return None
    return drop_carried_keys(overrides)
