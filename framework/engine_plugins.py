"""The engine's plugins, loaded and checked before anything is built: each named class
imported and checked against its interface, its options checked, and the pairs that cannot
work together refused. Imports no torch, so `schedlab run` reports a broken plugin or option
before the model, the KV pool or (for the policy plugins) torch itself is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedlab import registry
from schedlab.config import ConfigError, EngineConfig

if TYPE_CHECKING:
    from schedlab.executor import Executor

#: the order plugins are loaded in: those that import no torch first, so their errors come at once
LOAD_ORDER = ("scheduler", "queue", "kv_allocator", "prefix_cache", "attention", "executor")


@dataclass(frozen=True, slots=True)
class EnginePlugins:
    """The engine's six plugins, loaded and their options checked (nothing built yet).

    `attention` is None for an installed backend name: only the executor that runs a model
    loads its backend (and torch with it), so a simulated engine imports none.
    """

    scheduler: registry.Plugin
    queue: registry.Plugin
    kv_allocator: registry.Plugin
    prefix_cache: registry.Plugin
    attention: registry.Plugin | None
    executor: registry.Plugin


def resolve_plugins(cfg: EngineConfig,
                    executor_cls: type[Executor] | None = None) -> EnginePlugins:
    """Load every plugin the config names and check its options and the combinations, before
    a model or a KV pool exists. No state change.

    Args:
        executor_cls: an executor class in place of `cfg.executor` (a model-free fake).

    Raises:
        registry.PluginError: a plugin that is unknown or fails to load.
        ConfigError: an option a plugin does not take, or plugins that cannot work together.
    """
    found: dict[str, registry.Plugin] = {}
    attention: registry.Plugin | None = None
    for kind in LOAD_ORDER:
        spec = executor_cls if kind == "executor" and executor_cls is not None else getattr(
            cfg, kind)
        options = getattr(cfg, f"{kind}_options")
        if kind != "attention":
            found[kind] = registry.resolve(kind, spec, options)
        elif registry.is_dotted(spec) or spec not in registry.available(kind):
            attention = registry.resolve(kind, spec, options)  # an unknown one: the list
        # NOTE: an installed backend is loaded and checked by the executor that uses it
    plugins = EnginePlugins(attention=attention, **found)
    check_prefix_cache_fits(plugins.prefix_cache, plugins.kv_allocator)
    return plugins


def check_prefix_cache_fits(prefix_cache: registry.Plugin,
                            kv_allocator: registry.Plugin) -> None:
    """Raise ConfigError when the prefix cache needs shared blocks the allocator cannot give."""
    pc_name, alloc_name = prefix_cache.label, kv_allocator.label
    if prefix_cache.cls.requires_sharing and not kv_allocator.cls.supports_sharing:
        raise ConfigError(
            f"prefix_cache={pc_name} cannot work with kv_allocator="
            f"{alloc_name}: a prefix cache shares blocks between requests and "
            f"{alloc_name} gives each request a private region; use kv_allocator=paged"
        )
