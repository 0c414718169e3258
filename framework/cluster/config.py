"""The cluster's configuration: how many instances, which roles, the KV link between them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schedlab.config import ConfigError, parse_bytes

#: the KV link when none is configured: 25 GB/s (a 200 Gb/s InfiniBand NIC) and 0.1 ms per
#: transfer, the cross-node setting of Splitwise
DEFAULT_LINK_BANDWIDTH = "25GB"
DEFAULT_LINK_LATENCY = 1e-4
#: the most instances a cluster may have (prefill and decode ones together count each)
MAX_INSTANCES = 10_000


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """N engine instances on one virtual clock, behind a router.

    Args:
        num_instances: co-located instances (each prefills and decodes). With disaggregation
            it must be None or prefill_instances + decode_instances.
        prefill_instances: instances that only prefill (0: no disaggregation).
        decode_instances: instances that only decode (0: no disaggregation).
        router: the router plugin (a registered name, a `"module:Class"` path or a class).
        router_options: keyword arguments for the router's constructor.
        link_bandwidth: KV transfer bandwidth between a prefill and a decode instance, in
            bytes per second (`"25GB"` = 25e9 B/s).
        link_latency: seconds added to every KV transfer.
        clock: how real executors' steps are timed: `"wall"` or `"cpu"` (this thread's CPU
            time, for a shared machine with torch on one thread); the simulator ignores it.

    Raises:
        ConfigError: a value is out of range or the instance counts disagree.
    """

    num_instances: int | None = 1
    prefill_instances: int = 0
    decode_instances: int = 0
    router: Any = "round_robin"
    router_options: dict[str, Any] = field(default_factory=dict)
    link_bandwidth: int | float | str = DEFAULT_LINK_BANDWIDTH
    link_latency: float = DEFAULT_LINK_LATENCY
    clock: str = "wall"

    def __post_init__(self) -> None:
        def count(key: str, minimum: int) -> int:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise ConfigError(f"cluster.{key}={v!r} must be an integer >= {minimum}")
            if v > MAX_INSTANCES:
                raise ConfigError(f"cluster.{key}={v!r}: a cluster has at most "
                                  f"{MAX_INSTANCES:,} instances (each builds an engine and its "
                                  "KV pool: ~1.4 MB and ~12 ms on the sim executor)")
            return v

        p, d = count("prefill_instances", 0), count("decode_instances", 0)
        if p + d > MAX_INSTANCES:
            raise ConfigError(f"cluster.prefill_instances={p} + cluster.decode_instances={d}: a "
                              f"cluster has at most {MAX_INSTANCES:,} instances")
        if (p == 0) != (d == 0):
            raise ConfigError(
                f"cluster.prefill_instances={p} and cluster.decode_instances={d}: "
                "disaggregation needs at least one of each (or 0 and 0 for co-located instances)")
        if self.num_instances is not None:
            n = count("num_instances", 1)
            if p and n != p + d:
                raise ConfigError(
                    f"cluster.num_instances={n} but prefill_instances + decode_instances = "
                    f"{p + d}; set cluster.num_instances=null (or {p + d}), or set "
                    "prefill_instances and decode_instances to sum to it")
        elif not p:
            raise ConfigError("cluster.num_instances=null needs prefill_instances and "
                              "decode_instances; give cluster.num_instances=N")
        parse_bytes(self.link_bandwidth, "cluster.link_bandwidth")
        lat = self.link_latency
        if isinstance(lat, bool) or not isinstance(lat, int | float) or not (
                math.isfinite(lat) and lat >= 0):
            raise ConfigError(f"cluster.link_latency={lat!r} must be a number of seconds >= 0")
        if self.clock not in ("wall", "cpu"):
            raise ConfigError(f"cluster.clock={self.clock!r}; accepted: wall, cpu")
        if not isinstance(self.router_options, dict):
            raise ConfigError(f"cluster.router_options={self.router_options!r} must be a mapping")

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode run on separate instances."""
        return self.prefill_instances > 0

    @property
    def total_instances(self) -> int:
        """Every instance, both roles."""
        if self.disaggregated:
            return self.prefill_instances + self.decode_instances
        return self.num_instances or 1

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return float(parse_bytes(self.link_bandwidth, "cluster.link_bandwidth"))

    def transfer_time(self, num_bytes: int) -> float:
        """Seconds to move `num_bytes` of KV over the link: bytes / bandwidth + latency."""
        return num_bytes / self.bandwidth_bytes_per_s + float(self.link_latency)


#: the keys of the `cluster` config group (besides `name`)
CLUSTER_KEYS = ("num_instances", "prefill_instances", "decode_instances", "link_bandwidth",
                "link_latency", "clock")


def cluster_from_config(cluster: Mapping[str, Any] | None,
                        router: Mapping[str, Any] | None) -> ClusterConfig | None:
    """The `cluster` and `router` groups of a resolved config (plain mappings) as a
    `ClusterConfig`, or None for a single co-located instance (a plain engine run).

    Raises:
        ConfigError: an unknown key or a bad value (named as on the command line).
        PluginError: the router is not installed (the message lists the installed ones).
    """
    from schedlab import registry

    cluster = dict(cluster or {})
    router = dict(router or {"name": "round_robin"})
    unknown = sorted(set(cluster) - {"name", *CLUSTER_KEYS})
    if unknown:
        raise ConfigError(f"cluster.{unknown[0]} is not a cluster key; accepted: "
                          f"{', '.join(CLUSTER_KEYS)}")
    unknown = sorted(set(router) - {"name", "options"})
    if unknown:
        raise ConfigError(f"router.{unknown[0]} is not a key of the router group; accepted: "
                          "name, options")
    name = router.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"router.name={name!r} must be a router plugin name")
    if not registry.is_dotted(name) and name not in registry.available("router"):
        installed = ", ".join(registry.available("router")) or "none installed"
        raise registry.PluginError(f"router.name={name!r} is not an installed router plugin; "
                                   f"installed: {installed}")
    options = router.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"router.options={options!r} must be a mapping")
    cfg = ClusterConfig(router=name, router_options=dict(options),
                        **{k: cluster[k] for k in CLUSTER_KEYS if k in cluster})
    if not cfg.disaggregated and cfg.total_instances == 1:
        return None
    # a broken router, or options it does not take, fail now, not after the engines load
    registry.resolve("router", name, cfg.router_options)
    return cfg
