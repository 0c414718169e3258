"""The keys a `schedlab run` config may hold, section by section, and the check that refuses
any other one naming it and the accepted keys (`check_keys`, before `build_settings` reads the
config; `schedlab.cli.checks` asks `accepted_keys` of the command line's overrides)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from schedlab import registry
from schedlab.config import ConfigError, EngineConfig
from schedlab.runs.tracking import TrackingConfig

#: the config groups that name a plugin: group -> registry kind (the same names)
PLUGIN_GROUPS = tuple(registry.GROUPS)
#: the keys of a plugin group's node (`scheduler.name`, `scheduler.options`)
PLUGIN_GROUP_KEYS = ("name", "options")
#: the keys of `engine`: EngineConfig's fields but the model and the plugins (their own groups)
ENGINE_KEYS = tuple(k for k in EngineConfig.field_names() if k != "model" and k not in {
    *PLUGIN_GROUPS, *(f"{kind}_options" for kind in PLUGIN_GROUPS)})
#: the keys of `logger`: its `name` (the backend) and TrackingConfig's other fields
LOGGER_KEYS = ("name", *(f.name for f in fields(TrackingConfig) if f.name != "backend"))
#: the keys `build_settings` reads from each section of the config
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "sampling": ("temperature", "ignore_eos"),
    "driver": ("max_concurrency", "progress", "save_detailed", "workers", "plugin_timeout_s"),
    "metrics": ("percentiles", "slo"),
    "model": ("name", "path", "preset", "tiny"),
    "model.tiny": ("family", "size", "seed"),
    "paths": ("log_dir", "output_dir", "cache_dir", "data_dir"),
}
#: the top-level values `build_settings` reads (besides the sections and the groups)
ROOT_KEYS = ("seed", "plots", "print_table")
#: top-level nodes of others: an experiment's own values (`exp`: conf/experiment/,
#: experiments/summarize.py) and Hydra's (`hydra`, where a composed config keeps it)
FOREIGN_ROOT_KEYS = ("exp", "hydra")
#: nodes whose keys are not checked here: their readers check them (a plugin's options
#: against its constructor, `metrics.slo` in `_slo`) or they are not the run's
FREE_NODES = (*FOREIGN_ROOT_KEYS, "metrics.slo",
              *(f"{kind}.options" for kind in registry.all_groups()))


def accepted_keys(path: str, node: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The keys a run reads at `path` of the config (`""`: the top level), `node` being the
    mapping there; None where any key is taken (see `FREE_NODES`) or nothing is known."""
    from schedlab.cluster.config import CLUSTER_KEYS
    from schedlab.runs.workload import spec_keys

    if path in FREE_NODES:
        return None
    if not path:
        return (*ROOT_KEYS, "engine", *(k for k in SECTION_KEYS if "." not in k), "workload",
                "hardware", "logger", "cluster", *registry.all_groups(), *FOREIGN_ROOT_KEYS)
    if path in SECTION_KEYS:
        return SECTION_KEYS[path]
    if path == "engine":
        return ENGINE_KEYS
    if path in registry.all_groups():
        return PLUGIN_GROUP_KEYS
    if path == "cluster":
        return ("name", *CLUSTER_KEYS)
    if path == "logger":
        return LOGGER_KEYS
    if path == "hardware":
        return _hardware_keys()
    if path == "workload":
        return spec_keys(node)
    if path.startswith("workload.") and path.count(".") == 1:
        return spec_keys({}, path.partition(".")[2])  # arrival, a length spec
    return None


def check_keys(c: Mapping[str, Any]) -> None:
    """Refuse a key no reader takes, anywhere `accepted_keys` knows the keys, except under
    `engine`, `cluster` and the plugin groups, whose own checks say more, and `workload`,
    which `check_spec` checks (an unknown key is one added with `+`, or by a config file).

    Raises:
        ConfigError, WorkloadError: naming the key and the accepted keys.
    """
    from schedlab.runs.workload import check_spec

    def walk(path: str, node: Mapping[str, Any]) -> None:
        accepted = accepted_keys(path, node)
        if accepted is None:
            return
        unknown = sorted(str(k) for k in set(node) - set(accepted))
        if unknown:
            where = f"the {path} section" if path else "the config"
            raise ConfigError(f"{path + '.' if path else ''}{unknown[0]} is not a key of "
                              f"{where}; accepted: {', '.join(accepted)}")
        for k, v in node.items():
            sub = f"{path}.{k}" if path else str(k)
            if isinstance(v, Mapping) and sub not in ("engine", "cluster", "workload",
                                                      *registry.all_groups()):
                walk(sub, v)

    walk("", c)
    workload = c.get("workload")
    if isinstance(workload, Mapping):
        check_spec(workload)


def _hardware_keys() -> tuple[str, ...]:
    """A `hardware` node's keys: its base (`preset` or `path`) and the profile's fields."""
    from schedlab.sim.hardware import HardwareProfile

    return ("preset", "path", *(f.name for f in fields(HardwareProfile)))
