"""The cluster layer: N engine instances on one virtual clock behind a router, optionally
split into prefill and decode pools with KV transfer between them."""

from __future__ import annotations

from schedlab.cluster.cluster import Cluster, ClusterRunResult, build_router
from schedlab.cluster.config import ClusterConfig
from schedlab.cluster.instance import Instance, InstanceSummary, Role
from schedlab.cluster.router import InstanceLoad, Router
from schedlab.cluster.transfer import KVTransfer

__all__ = ["Cluster", "ClusterConfig", "ClusterRunResult", "Instance", "InstanceLoad",
           "InstanceSummary", "KVTransfer", "Role", "Router", "build_router"]
