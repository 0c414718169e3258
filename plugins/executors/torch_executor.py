"""The real executor: a Hugging Face checkpoint run with our attention over a packed batch."""

from __future__ import annotations

import time

import torch

from schedlab import registry
from schedlab.attention import AttentionBackend, AttentionMetadata, KVCacheSpec
from schedlab.config import EngineConfig
from schedlab.executor import Executor, ExecutorOutput, WallClock
from schedlab.model import (
    ATTN_IMPLEMENTATION,
    ForwardContext,
    ModelSpec,
    register_attention,
    resolve_dtype,
)
from schedlab.sampler import sample
from schedlab.scheduler import SchedulerOutput


class TorchExecutor(Executor):
    """Loads the checkpoint with transformers and runs each plan as one forward pass.

    Prefill chunks and decode tokens of all scheduled requests are packed into one sequence
    (`input_ids` of shape [1, T]) with per-token positions; every layer's attention goes to
    the configured `AttentionBackend`; logits are computed only at the positions that sample.
    """

    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoModelForCausalLM

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
        ).to(self.device)
        self.model.eval()
        self.backend: AttentionBackend | None = None
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        self.clock = WallClock()

    def kv_cache_spec(self, block_size: int) -> KVCacheSpec:
        s = self.model_spec
        return KVCacheSpec(s.num_layers, s.num_kv_heads, s.head_dim, self.dtype, block_size)

    def available_kv_memory(self) -> int | None:
        if self.device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        used = total - free
        # NOTE: like vLLM, leave (1 - gpu_memory_utilization) of the card plus room for activations.
        return max(0, int(total * self.config.gpu_memory_utilization) - used - (512 << 20))

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        self.backend = self.attn_cls(
            self.kv_cache_spec(block_size), num_blocks, self.device, **self.config.attention_options
        )

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        t0 = time.perf_counter()
        if plan.swap_out or plan.swap_in:
            # Swap preemption, before the forward. NOTE: every read (device blocks going out,
            # host slots coming in) happens before any write, so a block or slot freed and
            # reused within this plan is copied correctly in either direction.
            host = self.__dict__.setdefault("host_kv", {})  # host slot -> per-layer (k, v)
            out_data = (self.backend.copy_blocks_out([d for d, _ in plan.swap_out])
                        if plan.swap_out else [])
            in_data = [host.pop(h) for h, _ in plan.swap_in]
            for j, (_, h) in enumerate(plan.swap_out):
                host[h] = [(k[j].clone(), v[j].clone()) for k, v in out_data]
            if plan.swap_in:
                layers = zip(*in_data, strict=True)  # per layer: one (k, v) per swapped-in block
                self.backend.copy_blocks_in(
                    [d for _, d in plan.swap_in],
                    [(torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv]))
                     for kv in layers],
                )
        input_ids, positions, meta, logits_idx, order = self.prepare(plan)
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=logits_idx,
            schedlab_ctx=ForwardContext(self.backend, meta),
        )
        logits = out.logits[0]
        samplers = [plan.scheduled[i] for i in order if plan.scheduled[i].samples]
        tokens = sample(logits, [s.request for s in samplers], self.generator)
        sampled: list[int | None] = [None] * len(plan.scheduled)
        it = iter(tokens)
        for i in order:
            if plan.scheduled[i].samples:
                sampled[i] = next(it)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return ExecutorOutput(sampled, time.perf_counter() - t0)

    def prepare(self, plan: SchedulerOutput):
        """Pack a plan into model inputs and attention metadata (decodes first)."""
        sched = plan.scheduled
        order = sorted(range(len(sched)), key=lambda i: sched[i].num_new_tokens != 1)
        tokens: list[int] = []
        q_lens: list[int] = []
        starts: list[int] = []
        tables: list[list[int]] = []
        for i in order:
            s = sched[i]
            tokens.extend(s.request.token_slice(s.start, s.start + s.num_new_tokens))
            q_lens.append(s.num_new_tokens)
            starts.append(s.start)
            tables.append(s.block_ids)
        num_decodes = next((j for j, n in enumerate(q_lens) if n != 1), len(q_lens))
        bs = self.backend.block_size
        B, T = len(q_lens), len(tokens)
        q_lens_t = torch.tensor(q_lens, dtype=torch.int64)
        starts_t = torch.tensor(starts, dtype=torch.int64)
        cu = torch.zeros(B + 1, dtype=torch.int64)
        torch.cumsum(q_lens_t, 0, out=cu[1:])
        seq_idx = torch.repeat_interleave(torch.arange(B), q_lens_t)
        pos = starts_t[seq_idx] + torch.arange(T) - cu[:-1][seq_idx]
        max_blocks = max(len(t) for t in tables)
        bt = torch.zeros(B, max_blocks, dtype=torch.int64)
        for j, t in enumerate(tables):
            bt[j, : len(t)] = torch.tensor(t, dtype=torch.int64)
        slots = bt[seq_idx, pos // bs] * bs + pos % bs
        seq_lens = starts_t + q_lens_t
        logits_idx = [int(cu[j + 1]) - 1 for j, i in enumerate(order) if sched[i].samples]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=slots.to(dev, non_blocking=True),
            query_start_loc=cu.to(torch.int32).to(dev, non_blocking=True),
            seq_lens=seq_lens.to(torch.int32).to(dev, non_blocking=True),
            block_tables=bt.to(torch.int32).to(dev, non_blocking=True),
            query_lens=q_lens,
            seq_lens_host=seq_lens.tolist(),
            num_decodes=num_decodes,
            max_query_len=max(q_lens),
            max_seq_len=int(seq_lens.max()),
        )
        input_ids = torch.tensor(tokens, dtype=torch.int64).to(dev, non_blocking=True)[None]
        positions = pos.to(dev, non_blocking=True)[None]
        logits_t = torch.tensor(logits_idx, dtype=torch.int64).to(dev, non_blocking=True)
        return input_ids, positions, meta, logits_t, order
