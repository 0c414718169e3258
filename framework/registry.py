"""Plugin discovery on Python entry points, one group per interface, plus classes and dotted paths.

Discovery reads entry-point metadata only; a plugin's module is imported when it is first
loaded. Built-ins are declared in pyproject.toml exactly as a third-party package would.
Wherever a plugin is named, three spellings work: a registered name (`"fcfs"`), a dotted path
(`"my_module:MyQueue"`, imported with the current directory on `sys.path`, as `python -m`
does) and, from Python, the class itself. Every class is checked when it is loaded: it
subclasses the interface, implements its abstract methods and takes the arguments the engine
passes; each failure is one sentence naming where the class came from and what is missing.
`resolve` checks a plugin's options (`schedlab.plugin_options`) and `build` makes every plugin
instance, whatever its kind.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from schedlab import plugin_options
from schedlab.config import ConfigError
from schedlab.plugin_options import OptionSpec

#: interface name -> entry-point group
GROUPS: dict[str, str] = {
    "scheduler": "schedlab.schedulers",
    "queue": "schedlab.queues",
    "kv_allocator": "schedlab.kv_allocators",
    "prefix_cache": "schedlab.prefix_caches",
    "attention": "schedlab.attention_backends",
    "executor": "schedlab.executors",
}

#: plugin kinds above the engine (the cluster layer), looked up like the engine's but not
#: fields of EngineConfig, so engine-wide loops over GROUPS leave them out
CLUSTER_GROUPS: dict[str, str] = {
    "router": "schedlab.routers",
}

#: interface name -> "module:Class" of its ABC (a kind missing here gets no subclass check)
INTERFACES: dict[str, str] = {
    "scheduler": "schedlab.scheduler:Scheduler",
    "queue": "schedlab.queue:RequestQueue",
    "kv_allocator": "schedlab.kv_allocator:KVAllocator",
    "prefix_cache": "schedlab.prefix_cache:PrefixCache",
    "attention": "schedlab.attention:AttentionBackend",
    "executor": "schedlab.executor:Executor",
    "router": "schedlab.cluster.router:Router",
}

#: interface name -> the positional constructor arguments the engine passes; `*_options`
#: follow as keyword arguments
POSITIONAL: dict[str, tuple[str, ...]] = {
    "scheduler": ("config", "kv", "queue"),
    "queue": (),
    "kv_allocator": ("num_blocks", "block_size", "max_model_len"),
    "prefix_cache": ("block_size",),
    "attention": ("spec", "num_blocks", "device"),
    "executor": ("config",),
    "router": (),
}


class PluginError(ValueError):
    """An unknown, duplicated or broken plugin. The message says what is installed."""


@dataclass(frozen=True, slots=True)
class PluginEntry:
    """One declared plugin: an entry point, as metadata (nothing imported)."""

    kind: str
    name: str
    value: str  # "module:Class"
    dist: str  # the distribution that declares it

    @property
    def origin(self) -> str:
        return f"entry point {self.name} = {self.value} of distribution {self.dist}"


@cache
def _discover(group: str) -> dict[str, list[EntryPoint]]:
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=group):
        same = found.setdefault(ep.name, [])
        if all(prev.value != ep.value for prev in same):  # one package seen twice is one entry
            same.append(ep)
    return found


def _dist(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "unknown distribution"


def all_groups() -> dict[str, str]:
    """Every plugin kind -> its entry-point group: the engine's (`GROUPS`) and the cluster
    layer's (`CLUSTER_GROUPS`)."""
    return {**GROUPS, **CLUSTER_GROUPS}


def _group(kind: str) -> str:
    group = GROUPS.get(kind) or CLUSTER_GROUPS.get(kind)
    if group is None:
        kinds = ", ".join([*GROUPS, *CLUSTER_GROUPS])
        raise PluginError(f"unknown plugin kind {kind!r}; kinds: {kinds}")
    return group


def entries(kind: str) -> list[PluginEntry]:
    """Every declared plugin of an interface, clashing names included, by name. Nothing is
    imported."""
    out = [PluginEntry(kind, name, ep.value, _dist(ep))
           for name, eps in _discover(_group(kind)).items() for ep in eps]
    return sorted(out, key=lambda e: (e.name, e.dist, e.value))


def clashes(kind: str) -> dict[str, list[PluginEntry]]:
    """Names declared by more than one entry point (such a name cannot be loaded)."""
    out: dict[str, list[PluginEntry]] = {}
    for e in entries(kind):
        out.setdefault(e.name, []).append(e)
    return {n: es for n, es in out.items() if len(es) > 1}


def available(kind: str) -> list[str]:
    """Names registered for an interface, without importing any plugin."""
    return sorted(_discover(_group(kind)))


def is_dotted(spec: object) -> bool:
    """Whether `spec` is a `"module:Class"` path rather than a registered name."""
    return isinstance(spec, str) and ":" in spec


def describe(spec: object) -> str:
    """How a plugin spec reads in a message: `'fcfs'`, `'my_module:MyQueue'` or, for a class,
    `'my_module:MyQueue'` too."""
    if isinstance(spec, type):
        return repr(f"{spec.__module__}:{spec.__qualname__}")
    return repr(spec)


def interface(kind: str) -> type | None:
    """The ABC plugins of `kind` subclass (None for a kind without one)."""
    path = INTERFACES.get(kind)
    if path is None:
        return None
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@cache
def load(kind: str, spec: str | type) -> Any:
    """The plugin class for interface `kind`: a registered name, a `"module:Class"` path or a
    class, imported on first use and checked (see `check_class`).

    Raises:
        PluginError: the name is unknown (the message lists the installed names), declared by
            two packages, fails to import (the message names the distribution) or the class
            breaks the interface.
    """
    if isinstance(spec, type):
        cls, where = spec, f"class {spec.__module__}:{spec.__qualname__}"
    elif not isinstance(spec, str):
        raise PluginError(f"{kind}={spec!r} must be a plugin name, a 'module:Class' path or a "
                          "class")
    elif is_dotted(spec):
        cls, where = _import_dotted(kind, spec), f"dotted path {spec!r}"
    else:
        cls, where = _load_entry_point(kind, spec)
    check_class(kind, cls, where)
    return cls


def _load_entry_point(kind: str, name: str) -> tuple[Any, str]:
    eps = _discover(_group(kind)).get(name)
    if not eps:
        known = ", ".join(available(kind)) or "none installed"
        raise PluginError(f"unknown {kind} {name!r}; installed: {known}; or give a class as "
                          f"{kind}=module:Class")
    if len(eps) > 1:
        both = " and ".join(f"{ep.value} ({_dist(ep)})" for ep in eps)
        raise PluginError(f"{kind} name {name!r} is declared by {len(eps)} entry points, {both}; "
                          f"uninstall one, or name the class directly, e.g. {kind}={eps[0].value}")
    ep = eps[0]
    where = PluginEntry(kind, name, ep.value, _dist(ep)).origin
    try:
        return ep.load(), where
    except Exception as exc:  # a broken third-party plugin must not look like our bug
        raise PluginError(f"{kind} {name!r} ({where}) failed to load: {exc}") from exc


def _import_dotted(kind: str, spec: str) -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise PluginError(f"{kind}={spec!r} is not a 'module:Class' path")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # a notebook's or script's module next to it, as python -m finds it
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:
        raise PluginError(f"{kind}={spec!r}: module {module!r} failed to import: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{kind}={spec!r}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def check_class(kind: str, cls: Any, where: str) -> None:
    """Check that `cls` can serve as a `kind` plugin. No state change.

    Raises:
        PluginError: one sentence naming `where` the class came from and what is wrong: not a
            class, not a subclass of the interface, abstract methods left out, or a
            constructor that cannot take the engine's positional arguments.
    """
    if not isinstance(cls, type):
        raise PluginError(f"{kind} {where} is {cls!r}, not a class")
    base = interface(kind)
    if base is not None and not issubclass(cls, base):
        raise PluginError(f"{kind} {where} is not a subclass of {base.__module__}."
                          f"{base.__qualname__}; a {kind} plugin must subclass it")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        owner = base.__qualname__ if base is not None else "its base"
        raise PluginError(f"{kind} {where} does not implement the abstract method"
                          f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {owner}")
    positional = POSITIONAL.get(kind)
    if positional is None:
        return
    typed = plugin_options.options_class(cls) is not None
    try:
        inspect.signature(cls).bind(*positional, **({"options": None} if typed else {}))
    except TypeError as e:
        then = ("then its Options as the keyword `options`" if typed
                else "then options as keywords")
        raise PluginError(f"{kind} {where} has a constructor that cannot take the engine's "
                          f"arguments ({', '.join(positional) or 'none'}, {then}): {e}") from None
    except ValueError:  # no signature (a C type): nothing to check
        return


@dataclass(frozen=True, slots=True)
class Plugin:
    """A plugin class loaded and its options checked: what `build` makes an instance of.

    Attributes:
        kind: the interface.
        cls: the class.
        label: how messages name it (`'fcfs'`, `'my_module:MyQueue'`).
        kwargs: the keyword arguments it is built with (for typed options, `options=`).
    """

    kind: str
    cls: type[Any]
    label: str
    kwargs: dict[str, Any]


def option_specs(kind: str, cls: type) -> tuple[list[OptionSpec], bool]:
    """The options a `kind` plugin class takes, typed or read from its constructor. No state
    change.

    Returns:
        (the options, whether any name is accepted: a `**kwargs` that goes nowhere checked).
    """
    return plugin_options.option_specs(cls, len(POSITIONAL.get(kind, ())), interface(kind))


def resolve(kind: str, spec: str | type, options: Mapping[str, Any] | None = None) -> Plugin:
    """Load a plugin (see `load`) and check its options, building nothing. No state change.

    Raises:
        PluginError: as `load`.
        ConfigError: an option it does not take, or a value its typed options refuse.
    """
    cls = load(kind, spec)
    label = describe(spec)
    kwargs = plugin_options.constructor_options(kind, cls, dict(options or {}), label,
                                                len(POSITIONAL.get(kind, ())), interface(kind))
    return Plugin(kind, cls, label, kwargs)


def build(plugin: Plugin, *args: Any) -> Any:
    """An instance of a resolved plugin, built with the engine's positional `args`: the one
    place any plugin is constructed.

    Raises:
        ConfigError: the constructor raised TypeError or ValueError (named with the plugin and
            its options).
    """
    try:
        return plugin.cls(*args, **plugin.kwargs)
    except (TypeError, ValueError) as e:
        given = plugin.kwargs.get("options", plugin.kwargs)
        raise ConfigError(f"{plugin.kind} {plugin.label} could not be built with "
                          f"{plugin.kind}_options {given}: {e}") from None


def refresh() -> None:
    """Forget what was discovered (after installing a plugin package in-process)."""
    _discover.cache_clear()
    load.cache_clear()
