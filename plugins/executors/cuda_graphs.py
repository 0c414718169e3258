"""Decode steps padded to a batch-size bucket (and, for backends that need it, a context-length
bucket) over persistent input buffers; on CUDA each bucket is captured once as a CUDA graph and
replayed (the design and why: experiments/PERF_NOTES.md)."""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Sequence

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


def graph_context_lens(max_model_len: int, block_size: int, num: int = 6) -> list[int]:
    """The context buckets of a backend that captures per context length (ascending).

    Geometric with ratio sqrt(2) down from `max_model_len`: `max_model_len / 2**(k/2)` for
    k < `num`, each rounded up to whole blocks, duplicates dropped (1024 tokens, blocks of 16:
    192, 256, 368, 512, 736, 1024). A decode step goes to the smallest bucket holding its
    longest context, so each row reads at most ~1.41x that context's K/V width (below the
    smallest bucket, 0.18x `max_model_len`: up to that bucket); the most padding a row can
    get is ~0.29x `max_model_len` (ratio 2 would allow 0.5x, e.g. 513 -> 1024). Six buckets
    keep the graph count at 6x the batch buckets (210 for max_num_seqs=256).
    """
    if max_model_len < 1 or block_size < 1 or num < 1:
        raise ValueError(f"graph_context_lens({max_model_len}, {block_size}, {num}): "
                         "every argument must be >= 1")
    lens = set()
    for k in range(num):
        ctx = math.ceil(max_model_len / 2 ** (k / 2))
        lens.add(min(max_model_len, -(-ctx // block_size) * block_size))
    return sorted(lens)


class DecodeGraphRunner:
    """Runs decode-only steps of up to `max(sizes)` sequences at a bucket size.

    The step's inputs are copied into persistent buffers and the rows past the real batch are
    filler decodes (token 0 at position 0, slot `PAD_SLOT_ID`, context 1, block 0) whose
    logits are dropped. A backend that declares `graph_context_buckets` also gets a context
    bucket (`graph_context_lens`): the smallest holding the step's longest context, whose
    width the step's block tables take; otherwise the one context bucket is `max_model_len`.
    With `capture` (CUDA) every (batch, context) bucket's forward is captured once at start
    (largest first, one shared memory pool) and replayed; its logits are copied into one
    shared output buffer inside the graph, so no graph keeps an output of its own.

    The metadata of a bucket's forward is what a capture records: host copies at the context
    bucket's upper bound (`AttentionMetadata.graph_capture`), block tables of the bucket's
    width. Without `capture` the same padded forward runs eagerly with that same metadata
    (a new object each step): how a CPU tests exactly the code path the graphs replay.

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
        self.context_lens = (graph_context_lens(max_model_len, backend.block_size)
                             if backend.graph_context_buckets else [max_model_len])
        self.device, self.capture = device, capture
        n, width = self.sizes[-1], -(-max_model_len // backend.block_size)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), PAD_SLOT_ID, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.logits: torch.Tensor | None = None  # [max(sizes), vocab]: the graphs' output
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        if capture:
            self._capture_all()

    def bucket(self, num_seqs: int) -> int | None:
        """The smallest bucket holding `num_seqs` decodes (None: larger than every bucket)."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def context_bucket(self, max_seq_len: int) -> int | None:
        """The smallest context bucket holding `max_seq_len` (None: longer than every one)."""
        i = bisect.bisect_left(self.context_lens, max_seq_len)
        return self.context_lens[i] if i < len(self.context_lens) else None

    def fits(self, meta: AttentionMetadata) -> bool:
        """Whether `run` takes this step: decodes only, within a batch and a context bucket."""
        return (meta.num_decodes == meta.num_seqs and self.bucket(meta.num_seqs) is not None
                and self.context_bucket(meta.max_seq_len) is not None
                and meta.block_tables.shape[1] <= self.block_tables.shape[1])

    def _meta(self, size: int, context: int) -> AttentionMetadata:
        """The metadata a capture of bucket (`size`, `context`) records (a new object)."""
        width = -(-context // self.backend.block_size)
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size, :width],
            query_lens=[1] * size,
            seq_lens_host=[context] * size,
            num_decodes=size,
            max_query_len=1,
            max_seq_len=context,
            graph_capture=True,
        )

    def _forward(self, size: int, context: int) -> torch.Tensor:
        """Logits `[size, vocab]` of the bucket's forward over the persistent buffers."""
        out = self.model(
            input_ids=self.input_ids[:size][None],
            position_ids=self.positions[:size][None],
            use_cache=False,
            logits_to_keep=0,  # every row of a decode step samples
            schedlab_ctx=ForwardContext(self.backend, self._meta(size, context)),
        )
        return out.logits[0]

    def _capture_all(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool; one log line."""
        t0 = time.perf_counter()
        free0 = torch.cuda.mem_get_info(self.device)[0]
        pool = None
        for size in reversed(self.sizes):
            for context in reversed(self.context_lens):
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: Triton compiles, cuBLAS picks its kernels
                        logits = self._forward(size, context)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                if self.logits is None:
                    self.logits = torch.empty_like(logits)  # the largest bucket's shape
                del logits
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.logits[:size].copy_(self._forward(size, context))
                pool = graph.pool()
                self.graphs[(size, context)] = graph
        torch.cuda.synchronize(self.device)
        used = (free0 - torch.cuda.mem_get_info(self.device)[0]) / 2**20
        log.info("captured %d CUDA graphs (decode batch sizes %s x context lengths %s) in "
                 "%.1f s, %.0f MiB", len(self.graphs), self.sizes, self.context_lens,
                 time.perf_counter() - t0, used)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """The logits `[num_seqs, vocab]` of a decode-only step that `fits`.

        Args:
            input_ids, positions: `[1, num_seqs]`, as the executor prepared them.
            meta: the step's metadata (decodes only, real host copies).
        """
        n = meta.num_seqs
        size, context = self.bucket(n), self.context_bucket(meta.max_seq_len)
        assert size and context and meta.num_decodes == n, "not a decode step that fits a bucket"
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids[0], non_blocking=True)
        self.positions[:n].copy_(positions[0], non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        # NOTE: columns past `width` keep earlier steps' block ids: valid blocks, never read
        # past a context's length (masked, or not visited by a paged kernel)
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        if size > n:  # filler decodes
            self.input_ids[n:size] = 0
            self.positions[n:size] = 0
            self.slot_mapping[n:size] = PAD_SLOT_ID
            self.seq_lens[n:size] = 1
            self.block_tables[n:size, 0] = 0
        if self.capture:
            self.graphs[(size, context)].replay()
            assert self.logits is not None, "captured graphs write their logits"
            return self.logits[:n]
        return self._forward(size, context)[:n]
