"""KV transfer between a prefill and a decode instance (prefill/decode disaggregation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlab.engine import Engine
from schedlab.request import Request, RequestStatus


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
    data: list[Any] | None = None


def take_prefilled(engine: Engine, request: Request) -> tuple[int, list[Any] | None]:
    """Take a request whose prefill just finished off a prefill instance: read its prompt KV
    (real executors) and free it there, so the request can move on. Changes state.

    NOTE: the engine's `abort` is the public way to free a running request's KV; the request
    is then set back to RUNNING by `admit_transferred` on the decode side (its status, output
    and timestamps are kept; `finished_time` is cleared).

    Returns:
        (the number of prompt tokens whose KV moves, the KV per layer or None in simulation).
    """
    num_tokens = request.num_computed_tokens
    blocks = engine.kv.allocator.block_table(request)
    backend = getattr(engine.executor, "backend", None)
    data = None
    if backend is not None and hasattr(backend, "copy_blocks_out") and blocks:
        n = engine.kv.allocator.blocks_for(num_tokens)
        data = backend.copy_blocks_out(list(blocks[:n]))
    engine.abort(request.request_id)
    request.status = RequestStatus.WAITING
    request.finish_reason = None
    request.metrics.finished_time = None
    return num_tokens, data


def can_admit(engine: Engine, transfer: KVTransfer) -> bool:
    """Whether the decode instance has a seat and KV blocks for the transferred prompt (plus
    the next token). No state change."""
    sched = engine.scheduler
    if len(sched.running) >= engine.config.max_num_seqs:
        return False
    return engine.kv.can_allocate(transfer.request, transfer.num_tokens + 1)


def admit_transferred(engine: Engine, transfer: KVTransfer) -> None:
    """Put a request whose prompt KV arrived into the decode instance's running set, its
    prompt counted as computed: the next step decodes it. Changes state.

    The transferred blocks are allocated on the decode side (and, for real executors, the KV
    written into them); nothing is recomputed. Call `can_admit` first.

    Raises:
        RuntimeError: not enough KV blocks.
    """
    req = transfer.request
    engine.kv.allocate(req, transfer.num_tokens)
    if transfer.data is not None:
        blocks = engine.kv.allocator.block_table(req)
        engine.executor.backend.copy_blocks_in(list(blocks[: len(transfer.data[0][0])]),
                                               transfer.data)
        transfer.data = None
    req.num_computed_tokens = transfer.num_tokens
    req.status = RequestStatus.RUNNING
    engine.scheduler.running.append(req)
    engine.requests[req.request_id] = req


def reject_transferred(engine: Engine, transfer: KVTransfer, now: float) -> None:
    """A transferred request that can never fit the decode instance: end it as REJECTED with
    a reason (its first token stays counted). Changes the request only."""
    req = transfer.request
    req.status = RequestStatus.REJECTED
    req.finish_reason = RequestStatus.REJECTED.value
    req.reject_reason = (f"its {transfer.num_tokens}-token prompt KV does not fit decode "
                         f"instance {transfer.dst} ({engine.num_kv_blocks} KV blocks)")
    req.metrics.finished_time = now
