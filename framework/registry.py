"""Plugin discovery on Python entry points, one group per interface.

Discovery reads entry-point metadata only; a plugin's module is imported when it is first
loaded. Built-ins are declared in pyproject.toml exactly as a third-party package would.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

#: interface name -> entry-point group
GROUPS: dict[str, str] = {
    "scheduler": "schedlab.schedulers",
    "queue": "schedlab.queues",
    "kv_allocator": "schedlab.kv_allocators",
    "prefix_cache": "schedlab.prefix_caches",
    "attention": "schedlab.attention_backends",
    "executor": "schedlab.executors",
}


class PluginError(ValueError):
    """An unknown, duplicated or broken plugin. The message says what is installed."""


@cache
def _discover(group: str) -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        prev = found.get(ep.name)
        if prev is not None and prev.value != ep.value:
            raise PluginError(
                f"plugin name {ep.name!r} in {group} is declared twice: {prev.value} "
                f"({_dist(prev)}) and {ep.value} ({_dist(ep)})"
            )
        found[ep.name] = ep
    return found


def _dist(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "unknown distribution"


def available(kind: str) -> list[str]:
    """Names registered for an interface, without importing any plugin."""
    return sorted(_discover(_group(kind)))


def _group(kind: str) -> str:
    try:
        return GROUPS[kind]
    except KeyError:
        raise PluginError(f"unknown plugin kind {kind!r}; kinds: {', '.join(GROUPS)}") from None


@cache
def load(kind: str, name: str) -> Any:
    """The plugin class registered as `name` for interface `kind`, imported on first use.

    Raises:
        PluginError: the name is unknown (the message lists the installed names) or its
            module fails to import (the message names the distribution).
    """
    eps = _discover(_group(kind))
    ep = eps.get(name)
    if ep is None:
        known = ", ".join(sorted(eps)) or "none installed"
        raise PluginError(f"unknown {kind} {name!r}; installed: {known}")
    try:
        return ep.load()
    except Exception as exc:  # a broken third-party plugin must not look like our bug
        raise PluginError(
            f"{kind} {name!r} from {_dist(ep)} ({ep.value}) failed to load: {exc}"
        ) from exc


def refresh() -> None:
    """Forget what was discovered (after installing a plugin package in-process)."""
    _discover.cache_clear()
    load.cache_clear()
