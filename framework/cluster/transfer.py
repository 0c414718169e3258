"""KV transfer between a prefill and a decode instance (prefill/decode disaggregation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlab.engine import Engine
from schedlab.request import MigratedRequest, Request, RequestStatus


@dataclass(slots=True)
class KVTransfer:
    """One request's prompt KV on its way from a prefill to a decode instance.

    Args:
        request: the request; its prompt is computed and its first token sampled.
        src: the prefill instance's index in the cluster.
        dst: the decode instance's index in the cluster.
        num_tokens: tokens of KV moved (the prompt).
        num_bytes: bytes moved (whole blocks, as a paged KV transfer moves them).
        start_time: when the prefill finished (cluster time, s).
        ready_time: when the KV has arrived: start + bytes / bandwidth + latency.
        data: the KV itself, per layer, for real executors (None for the simulator).
    """

    request: Request
    src: int
    dst: int
    num_tokens: int
    num_bytes: int
    start_time: float
    ready_time: float
    data: Any | None = None


def take_prefilled(engine: Engine, request: Request) -> tuple[int, Any | None]:
    """Take a request whose prefill just finished off a prefill instance, with its prompt KV
    (real executors), through `Engine.migrate_out`. Changes state.

    Returns:
        (the number of tokens whose KV moves, the KV or None in simulation).
    """
    m = engine.migrate_out(request.request_id)
    return m.num_tokens, m.data


def _migrated(transfer: KVTransfer) -> MigratedRequest:
    return MigratedRequest(transfer.request, transfer.num_tokens, transfer.data)


def can_admit(engine: Engine, transfer: KVTransfer) -> bool:
    """Whether the decode instance has a seat and KV blocks for the transferred prompt (plus
    the next token). No state change."""
    return engine.can_migrate_in(_migrated(transfer))


def admit_transferred(engine: Engine, transfer: KVTransfer) -> None:
    """Continue a request whose prompt KV arrived on the decode instance
    (`Engine.migrate_in`): the blocks are allocated there and, for real executors, the KV
    written into them; nothing is recomputed. Call `can_admit` first. Changes state."""
    engine.migrate_in(_migrated(transfer))
    transfer.data = None


def reject_transferred(engine: Engine, transfer: KVTransfer, now: float) -> None:
    """A transferred request that can never fit the decode instance: end it as REJECTED with
    a reason (its first token stays counted). Changes the request only."""
    req = transfer.request
    req.end(RequestStatus.REJECTED, now,
            f"its {transfer.num_tokens}-token prompt KV does not fit decode instance "
            f"{transfer.dst} ({engine.num_kv_blocks} KV blocks)")
