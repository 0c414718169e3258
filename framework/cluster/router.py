"""The routing seam: which instance of a cluster a request goes to, and nothing else."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from schedlab.request import Request


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """One instance's load as a router sees it (a snapshot; routers never touch an engine).

    Args:
        index: the instance's position in the pool the router chooses from.
        num_running: requests holding a seat.
        num_waiting: requests queued (and, on a decode instance, KV transfers waiting for a
            seat).
        outstanding_tokens: tokens still to process: prompt tokens not yet computed plus
            output tokens not yet generated, over every request routed there and unfinished.
        kv_free_blocks: free KV blocks.
        num_kv_blocks: the KV pool.
        cached_prefix_tokens: the longest prefix of the request being routed that the
            instance's prefix cache holds (0 without a prefix cache).
    """

    index: int
    num_running: int
    num_waiting: int
    outstanding_tokens: int
    kv_free_blocks: int
    num_kv_blocks: int
    cached_prefix_tokens: int = 0


class Router(ABC):
    """Chooses an instance for each arriving request (the cluster's global scheduler).

    The cluster calls `bind` once, then `select` per request and `on_finished` when a request
    it routed ends. With prefill/decode disaggregation the cluster keeps one router for the
    prefill pool and one for the decode pool, so a router only ever sees one pool.

    Args:
        **options: the router's options (`router.options` in the config); the base class
            refuses any.
    """

    #: whether `select` needs `InstanceLoad.cached_prefix_tokens` (a prefix lookup on every
    #: instance per request; the cluster skips it for routers that do not read it)
    uses_prefix: bool = False

    def __init__(self, **options: object) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")
        self.num_instances = 0

    def bind(self, num_instances: int) -> None:
        """Start routing over a pool of `num_instances` instances (indices 0..n-1); forget
        any earlier state. Changes state.

        Raises:
            ValueError: `num_instances` is below 1.
        """
        if num_instances < 1:
            raise ValueError(f"a router needs at least one instance, got {num_instances}")
        self.num_instances = num_instances

    @abstractmethod
    def select(self, request: Request, loads: Sequence[InstanceLoad]) -> int:
        """Choose the instance for `request`. May change the router's own state (a
        round-robin cursor, say), never the instances'.

        Args:
            request: the arriving request (prompt, sampling params, client, priority); it is
                not yet in any engine.
            loads: one snapshot per instance of the pool, `loads[i].index == i`.

        Returns:
            The chosen instance's index, in `[0, len(loads))`.
        """

    def static_routes(self, num_requests: int) -> list[int] | None:
        """The instances of the next `num_requests` requests, in routing order, when this
        router's choices depend on nothing but their order (round robin): what `select`
        would return for each, known before any is routed, so that a simulated cluster's
        instances can run in separate processes (`run_workload(..., workers=N)`). None (the
        default): the choices depend on the requests or the loads. No state change.
        """
        del num_requests
        return None

    def on_routed(self, request: Request, index: int) -> None:  # noqa: B027 (optional hook)
        """Told after `request` was added to instance `index` (a rejected request included).
        Changes state in routers that keep their own view of the instances."""

    def on_finished(self, request: Request, index: int) -> None:  # noqa: B027 (optional hook)
        """Told when a request this router sent to instance `index` ends there (finished,
        rejected or aborted; on a prefill instance: its prefill is done). Changes state in
        routers that keep their own view of the instances."""

    def check_integrity(self) -> None:
        """Raise AssertionError if the router's own state is inconsistent. No state change."""
        assert self.num_instances >= 1, "router used before bind()"

    # ---- helpers for routers (concrete) --------------------------------------------------
    @staticmethod
    def least_loaded(loads: Sequence[InstanceLoad]) -> int:
        """The index with the fewest outstanding tokens (ties: fewest requests, then lowest
        index). No state change."""
        best = min(loads, key=lambda x: (x.outstanding_tokens, x.num_running + x.num_waiting,
                                         x.index))
        return best.index
