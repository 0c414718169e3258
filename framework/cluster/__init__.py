"""The cluster layer: N engine instances on one virtual clock behind a router, optionally
split into prefill and decode pools with KV transfer between them.

NOTE: names are imported on first use, so that the command line can read `ClusterConfig`
without importing the engine (and torch).
"""

from __future__ import annotations

from schedlab._lazy import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "Cluster": "schedlab.cluster.cluster",
    "ClusterRunResult": "schedlab.cluster.record",
    "build_router": "schedlab.cluster.routing",
    "ClusterConfig": "schedlab.cluster.config",
    "Instance": "schedlab.cluster.instance",
    "InstanceSummary": "schedlab.cluster.instance",
    "Role": "schedlab.cluster.instance",
    "InstanceLoad": "schedlab.cluster.router",
    "Router": "schedlab.cluster.router",
    "KVTransfer": "schedlab.cluster.transfer",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
