"""Decode steps padded to a batch-size bucket over persistent input buffers; on CUDA each bucket
is captured once as a CUDA graph and replayed (the design and why: experiments/PERF_NOTES.md)."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from schedlab.attention import PAD_SLOT_ID, AttentionBackend, AttentionMetadata
from schedlab.model import ForwardContext

log = logging.getLogger(__name__)


def graph_batch_sizes(sizes: Sequence[int], max_num_seqs: int) -> list[int]:
    """The decode batch sizes to capture, as vLLM reads `cuda_graph_sizes`.

    `[]` or one value N: 1, 2, 4, 8, then every multiple of 8 up to N (default N =
    `max_num_seqs`); several values: exactly those. Sizes above `max_num_seqs` are dropped
    (a step never runs more sequences), keeping at least `max_num_seqs` itself.
    """
    if len(sizes) <= 1:
        top = sizes[0] if sizes else max_num_seqs
        out = [n for n in (1, 2, 4) if n <= top] + list(range(8, top + 1, 8))
        if top not in out:
            out.append(top)
    else:
        out = sorted(set(sizes))
    kept = [n for n in out if n <= max_num_seqs]
    if len(kept) < len(out) and max_num_seqs not in kept:
        kept.append(max_num_seqs)
    return kept


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [1, size, vocab]: the captured forward's output buffer


class DecodeGraphRunner:
    """Runs decode-only steps of up to `max(sizes)` sequences at a bucket size.

    The step's inputs are copied into persistent buffers and the rows past the real batch are
    filler decodes (token 0 at position 0, slot `PAD_SLOT_ID`, context 1, block 0) whose
    logits are dropped. With `capture` (CUDA) every bucket's forward is captured once at start
    and replayed; the captured metadata's host copies are the upper bounds `max_model_len`,
    as `AttentionMetadata.graph_capture` says. Without it the same padded step runs eagerly
    with the real host copies: how a CPU tests the bucketing that the graphs replay.

    Args:
        model: the HF causal LM (attention routed to `backend`).
        backend: the attention backend; it must declare `supports_cuda_graphs` to be captured.
        sizes: bucket sizes (`graph_batch_sizes`).
        max_model_len: the longest context a step may have.
        device: where the buffers live.
        capture: capture CUDA graphs (needs a CUDA device).
    """

    def __init__(self, model, backend: AttentionBackend, sizes: Sequence[int],
                 max_model_len: int, device: torch.device, capture: bool) -> None:
        if not sizes:
            raise ValueError("DecodeGraphRunner needs at least one batch size")
        self.model, self.backend = model, backend
        self.sizes = sorted(sizes)
        self.max_model_len = max_model_len
        self.device, self.capture = device, capture
        n, width = self.sizes[-1], -(-max_model_len // backend.block_size)
        kw = dict(device=device)
        self.input_ids = torch.zeros(n, dtype=torch.int64, **kw)
        self.positions = torch.zeros(n, dtype=torch.int64, **kw)
        self.slot_mapping = torch.full((n,), PAD_SLOT_ID, dtype=torch.int64, **kw)
        self.seq_lens = torch.ones(n, dtype=torch.int32, **kw)
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, **kw)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, **kw)
        self.graphs: dict[int, _Graph] = {}
        if capture:
            self._capture_all()

    def bucket(self, num_seqs: int) -> int | None:
        """The smallest bucket holding `num_seqs` decodes (None: larger than every bucket)."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def _meta(self, size: int, seq_lens_host: list[int], capture: bool) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            query_lens=[1] * size,
            seq_lens_host=seq_lens_host,
            num_decodes=size,
            max_query_len=1,
            max_seq_len=max(seq_lens_host),
            graph_capture=capture,
        )

    def _forward(self, size: int, meta: AttentionMetadata) -> torch.Tensor:
        out = self.model(
            input_ids=self.input_ids[:size][None],
            position_ids=self.positions[:size][None],
            use_cache=False,
            logits_to_keep=0,  # every row of a decode step samples
            schedlab_ctx=ForwardContext(self.backend, meta),
        )
        return out.logits

    def _capture_all(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool."""
        pool = None
        for size in reversed(self.sizes):
            meta = self._meta(size, [self.max_model_len] * size, capture=True)
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton compiles, cuBLAS picks its kernels
                    self._forward(size, meta)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(size, meta)
            pool = graph.pool()
            self.graphs[size] = _Graph(graph, logits)
        torch.cuda.synchronize(self.device)
        log.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """The logits `[num_seqs, vocab]` of a decode-only step that fits a bucket.

        Args:
            input_ids, positions: `[1, num_seqs]`, as the executor prepared them.
            meta: the step's metadata (decodes only).
        """
        n = meta.num_seqs
        size = self.bucket(n)
        assert size is not None and meta.num_decodes == n, "not a decode step that fits a bucket"
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids[0], non_blocking=True)
        self.positions[:n].copy_(positions[0], non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        if size > n:  # filler decodes
            self.input_ids[n:size] = 0
            self.positions[n:size] = 0
            self.slot_mapping[n:size] = PAD_SLOT_ID
            self.seq_lens[n:size] = 1
            self.block_tables[n:size, 0] = 0
        if self.capture:
            g = self.graphs[size]
            g.graph.replay()
            return g.logits[0, :n]
        host = [*meta.seq_lens_host, *[1] * (size - n)]
        return self._forward(size, self._meta(size, host, capture=False))[0, :n]
