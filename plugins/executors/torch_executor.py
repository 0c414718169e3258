"""The real executor: a Hugging Face checkpoint run with our attention over a packed batch."""

from __future__ import annotations

import itertools
import logging
import time

import numpy as np
import torch

from schedlab import registry
from schedlab.attention import AttentionBackend, AttentionMetadata
from schedlab.clock import WallClock
from schedlab.config import EngineConfig
from schedlab.executor import Executor, ExecutorOutput, ExecutorTimings
from schedlab.model import ATTN_IMPLEMENTATION, ForwardContext, register_attention, resolve_dtype
from schedlab.plan import SchedulerOutput
from schedlab.plugins.executors.cuda_graphs import DecodeGraphRunner, graph_batch_sizes
from schedlab.sampler import sample
from schedlab.shapes import KVCacheSpec, ModelSpec

log = logging.getLogger(__name__)


def cuda_graphs_enabled(config: EngineConfig, device: torch.device,
                        attn_cls: type[AttentionBackend]) -> bool:
    """Whether decode steps are captured as CUDA graphs: on a CUDA device, unless
    `enforce_eager`, and only with a backend that `supports_cuda_graphs` (else one log line
    says its steps run eagerly)."""
    if device.type != "cuda" or config.enforce_eager:
        return False
    if not attn_cls.supports_cuda_graphs:
        log.warning("attention=%s cannot run inside a CUDA graph: its steps run eagerly "
                    "(as with enforce_eager=true)", config.attention)
        return False
    return True


class TorchExecutor(Executor):
    """Loads the checkpoint with transformers and runs each plan as one forward pass.

    Prefill chunks and decode tokens of all scheduled requests are packed into one sequence
    (`input_ids` of shape [1, T]) with per-token positions; every layer's attention goes to
    the configured `AttentionBackend`; logits are computed only at the positions that sample.

    On a CUDA device (unless `enforce_eager`) decode-only steps of at most the largest of
    `cuda_graph_sizes` sequences are padded to a bucket (and a context bucket, for backends
    that need one) and replayed from CUDA graphs captured at start (`DecodeGraphRunner`);
    other steps run eagerly. Each step reports its host time by phase
    (`ExecutorOutput.timings`).
    """

    def __init__(self, config: EngineConfig, num_threads: int | None = None,
                 emulate_cuda_graphs: bool = False) -> None:
        """Args:
            config: the engine config (model directory, dtype, device, attention backend).
            num_threads: torch's intra-op threads on the CPU (None: torch's default); one
                thread gives steadier timings on a small shared machine.
            emulate_cuda_graphs: run decode steps through the CUDA-graph path (padded to a
                bucket, persistent buffers, the metadata a capture records) without capturing:
                a CPU test of what the graphs replay. Ignored when graphs are captured.
        """
        from transformers import AutoModelForCausalLM

        if num_threads is not None:
            if not isinstance(num_threads, int) or num_threads <= 0:
                raise ValueError(f"executor num_threads={num_threads!r} must be a positive integer")
            torch.set_num_threads(num_threads)
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for but torch sees no CUDA device")
        self.dtype = resolve_dtype(config.dtype)
        self.model_spec = ModelSpec.from_pretrained(config.model)
        self.attn_cls: type[AttentionBackend] = registry.load("attention", config.attention)
        self.attn_cls.check_available(self.device)
        register_attention()
        self.model = AutoModelForCausalLM.from_pretrained(
            config.model, dtype=self.dtype, attn_implementation=ATTN_IMPLEMENTATION
        ).to(self.device)  # type: ignore[arg-type]  # transformers types `to` as a decorator's
        self.model.eval()
        if not isinstance(emulate_cuda_graphs, bool):
            raise ValueError(f"executor emulate_cuda_graphs={emulate_cuda_graphs!r} must be "
                             "true or false")
        self.emulate_cuda_graphs = emulate_cuda_graphs
        self.backend: AttentionBackend | None = None
        self.graph_runner: DecodeGraphRunner | None = None
        #: swap preemption's host pool: host slot -> per-layer (k, v) of one block
        self.host_kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        self.clock = WallClock()

    def kv_cache_spec(self, block_size: int) -> KVCacheSpec:
        s = self.model_spec
        return KVCacheSpec(s.num_layers, s.num_kv_heads, s.head_dim, self.dtype, block_size)

    def export_kv(self, block_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self._backend().copy_blocks_out(block_ids)

    def import_kv(self, block_ids: list[int], data: object) -> None:
        if not isinstance(data, list):
            raise TypeError(f"import_kv takes what export_kv returned, got {type(data).__name__}")
        self._backend().copy_blocks_in(block_ids, data)

    def _backend(self) -> AttentionBackend:
        if self.backend is None:
            raise RuntimeError("the KV cache is not allocated yet: call initialize_cache first")
        return self.backend

    def available_kv_memory(self) -> int | None:
        if self.device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        used = total - free
        # NOTE: like vLLM, leave (1 - gpu_memory_utilization) of the card plus room for activations.
        return max(0, int(total * self.config.gpu_memory_utilization) - used - (512 << 20))

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        cfg = self.config
        attention = registry.resolve("attention", cfg.attention, cfg.attention_options)
        self.backend = registry.build(attention, self.kv_cache_spec(block_size), num_blocks,
                                      self.device)
        capture = cuda_graphs_enabled(cfg, self.device, self.attn_cls)
        if capture or self.emulate_cuda_graphs:
            max_len = cfg.max_model_len or self.model_spec.max_position_embeddings
            sizes = graph_batch_sizes(cfg.cuda_graph_sizes, cfg.max_num_seqs)
            with torch.inference_mode():
                self.graph_runner = DecodeGraphRunner(self.model, self.backend, sizes, max_len,
                                                      self.device, capture)

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        t0 = time.perf_counter()
        if plan.swap_out or plan.swap_in:
            self._swap(plan)
        input_ids, positions, meta, logits_idx, order, reqs, samples = self._prepare(plan)
        t1 = time.perf_counter()
        runner = self.graph_runner
        # NOTE: a graph gives a row of logits per sequence: only a step in which every one
        # samples (a 1-token prefill chunk among the decodes does not) can take it
        if runner is not None and logits_idx.shape[0] == meta.num_seqs and runner.fits(meta):
            logits = runner.run(input_ids, positions, meta)
        else:
            logits = self.model(
                input_ids=input_ids,
                position_ids=positions,
                use_cache=False,
                logits_to_keep=logits_idx,
                schedlab_ctx=ForwardContext(self.backend, meta),
            ).logits[0]
        t2 = t3 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            t3 = time.perf_counter()
        tokens = sample(logits, [reqs[i] for i, s in zip(order, samples, strict=True) if s],
                        self.generator)
        sampled: list[int | None] = [None] * len(reqs)
        it = iter(tokens)
        for i, s in zip(order, samples, strict=True):
            if s:
                sampled[i] = next(it)
        t4 = time.perf_counter()  # `sample` hands back Python ints: the device is done
        return ExecutorOutput(sampled, t4 - t0,
                              ExecutorTimings(t1 - t0, t2 - t1, t3 - t2, t4 - t3))

    def _swap(self, plan: SchedulerOutput) -> None:
        """Swap preemption, before the forward: device blocks out to host slots, host slots
        back into device blocks.

        NOTE: every read (device blocks going out, host slots coming in) happens before any
        write, so a block or slot freed and reused within this plan is copied correctly in
        either direction.
        """
        host = self.host_kv
        out_data = (self._backend().copy_blocks_out([d for d, _ in plan.swap_out])
                    if plan.swap_out else [])
        in_data = [host.pop(h) for h, _ in plan.swap_in]
        for j, (_, h) in enumerate(plan.swap_out):
            host[h] = [(k[j].clone(), v[j].clone()) for k, v in out_data]
        if plan.swap_in:
            layers = zip(*in_data, strict=True)  # per layer: one (k, v) per swapped-in block
            self._backend().copy_blocks_in(
                [d for _, d in plan.swap_in],
                [(torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv]))
                 for kv in layers],
            )

    def prepare(self, plan: SchedulerOutput):
        """Pack a plan into model inputs and attention metadata: (input ids, positions,
        metadata, logits rows, batch order).

        Decodes come first, longest context first (so a backend that pads a group of decodes
        to its longest pads little), then the prefill chunks in plan order. Index arithmetic
        runs once per step in numpy over the whole batch; each tensor is made once.
        """
        return self._prepare(plan)[:5]

    def _prepare(self, plan: SchedulerOutput):
        """`prepare`, and the plan's requests and, in batch order, whether each samples.

        NOTE: the plan's columns, not its entries: a decode run is read as its lists."""
        reqs, starts_l, q_lens_l, tables = plan.columns()
        num_seqs = len(reqs)
        num_tokens = np.fromiter(
            (len(r.prompt_token_ids) + len(r.output_token_ids) for r in reqs), np.int64, num_seqs)
        starts = np.array(starts_l, dtype=np.int64)
        q_lens_np = np.array(q_lens_l, dtype=np.int64)
        is_decode = q_lens_np == 1
        num_decodes = int(is_decode.sum())
        # decodes first, longest context first; then the prefill chunks in plan order
        key = np.where(is_decode, -starts, np.arange(num_seqs) + 1)
        order_np = np.argsort(key, kind="stable")
        order: list[int] = order_np.tolist()
        starts, q_lens_np = starts[order_np], q_lens_np[order_np]
        samples = (starts + q_lens_np) == num_tokens[order_np]
        tokens: list[int] = []
        for i in order:
            r, start, q = reqs[i], starts_l[i], q_lens_l[i]
            if q == 1:
                o = start - len(r.prompt_token_ids)
                tokens.append(r.output_token_ids[o] if o >= 0 else r.prompt_token_ids[start])
            else:
                tokens.extend(r.token_slice(start, start + q))
        q_lens: list[int] = q_lens_np.tolist()
        bt = _padded_block_tables(tables)[order_np]
        bs = self._backend().block_size
        cu = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(q_lens_np, out=cu[1:])
        seq_lens = starts + q_lens_np
        if num_decodes == num_seqs:  # decode only: one token per sequence
            pos = starts
            slots = bt[np.arange(num_seqs), pos // bs] * bs + pos % bs
        else:
            seq_idx = np.repeat(np.arange(num_seqs), q_lens_np)
            pos = starts[seq_idx] + np.arange(len(tokens)) - cu[:-1][seq_idx]
            slots = bt[seq_idx, pos // bs] * bs + pos % bs
        logits_idx = cu[1:][samples] - 1
        dev = self.device

        def put(a: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            t = torch.from_numpy(a).to(dtype)
            if dev.type == "cuda":
                return t.pin_memory().to(dev, non_blocking=True)
            return t.to(dev)

        meta = AttentionMetadata(
            slot_mapping=put(slots),
            query_start_loc=put(cu, torch.int32),
            seq_lens=put(seq_lens, torch.int32),
            block_tables=put(bt, torch.int32),
            query_lens=q_lens,
            seq_lens_host=seq_lens.tolist(),
            num_decodes=num_decodes,
            max_query_len=max(q_lens),
            max_seq_len=int(seq_lens.max()),
        )
        input_ids = put(np.asarray(tokens, dtype=np.int64))[None]
        positions = put(np.ascontiguousarray(pos))[None]
        return input_ids, positions, meta, put(logits_idx), order, reqs, samples.tolist()


def _padded_block_tables(tables: list[list[int]]) -> np.ndarray:
    """[B, longest] int64 block tables, each row padded with block 0."""
    lens = np.fromiter(map(len, tables), np.int64, len(tables))
    out = np.zeros((len(tables), int(lens.max())), dtype=np.int64)
    out[np.arange(out.shape[1]) < lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(tables), np.int64, int(lens.sum()))
    return out
