"""The cluster's calls of its router plugins: the configured router built, the pool's loads
as it reads them, and each call guarded (an exception named on the router in one sentence, a
choice checked to be an instance of the pool)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

from schedlab import registry
from schedlab.cluster.config import ClusterConfig
from schedlab.cluster.router import InstanceLoad, Router
from schedlab.faults import PluginSlot, blame
from schedlab.request import Request

if TYPE_CHECKING:
    from schedlab.cluster.instance import Instance


def build_router(config: ClusterConfig) -> Router:
    """The configured router, built with its options.

    Raises:
        PluginError: an unknown router name.
        ConfigError: options the router does not take, or out of range.
    """
    return registry.build(registry.resolve("router", config.router, config.router_options))


def choose(router: Router, label: str, request: Request,
           loads: Sequence[InstanceLoad]) -> int:
    """The router's `select` for `request` over `loads`, checked.

    Raises:
        PluginContractError: the router raised (named by `label`, its method and line).
        PluginError: it chose no instance of the pool.
    """
    try:
        j = router.select(request, loads)
    except Exception as e:
        raise _blame(e, router, label, "select") from e
    n = len(loads)
    if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < n:
        raise registry.PluginError(
            f"router {type(router).__name__}.select returned {j!r}; it must return an "
            f"instance index in [0, {n})")
    return j


def tell(router: Router, label: str, method: str, request: Request, j: int) -> None:
    """The router's `on_routed` / `on_finished` of `request` on instance `j` of its pool.

    Raises:
        PluginContractError: the router raised (named by `label`, the method and line).
    """
    try:
        getattr(router, method)(request, j)
    except Exception as e:
        raise _blame(e, router, label, method) from e


def _blame(exc: Exception, router: Router, label: str, method: str):
    """The one-sentence error for what a router call raised (`schedlab.faults.blame`):
    `router 'name' raised ... in select() (file:line)`, the original as its cause."""
    slot = PluginSlot("router", router, label)
    return blame(exc, [slot], slot, method, None)


class Loads(Sequence[InstanceLoad]):
    """The pool's loads as a router sees them, each taken when the router first reads it (a
    round-robin router reads none: a load sums over every request in flight there).

    Args:
        pool: the instances, in the router's order.
        probe: the request being routed, when the router reads cached prefixes.
    """

    def __init__(self, pool: Sequence[Instance], probe: Request | None) -> None:
        self._pool = pool
        self._probe = probe
        self._taken: list[InstanceLoad | None] = [None] * len(pool)

    def __len__(self) -> int:
        return len(self._pool)

    @overload
    def __getitem__(self, j: int) -> InstanceLoad: ...
    @overload
    def __getitem__(self, j: slice) -> list[InstanceLoad]: ...

    def __getitem__(self, j: int | slice) -> InstanceLoad | list[InstanceLoad]:
        if isinstance(j, slice):
            return [self[k] for k in range(len(self))[j]]
        load = self._taken[j]  # IndexError past the end
        return self._take(j % len(self._taken)) if load is None else load

    def __iter__(self) -> Iterator[InstanceLoad]:
        for k, load in enumerate(self._taken):
            yield self._take(k) if load is None else load

    def _take(self, k: int) -> InstanceLoad:
        inst, probe = self._pool[k], self._probe
        load = reindex(inst.load(0 if probe is None else inst.cached_prefix_tokens(probe)), k)
        self._taken[k] = load
        return load


def reindex(load, j: int):
    """The load with its index in the router's pool (decode pools start at 0)."""
    if load.index == j:
        return load
    from dataclasses import replace

    return replace(load, index=j)
