"""How an `Engine` is sized: the limits the scheduler plans under and the KV / swap pool sizes
(its plugins are loaded and checked first, by `schedlab.engine_plugins`). Each function reads
the config and raises `ConfigError` naming the value to change."""

from __future__ import annotations

from schedlab.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, ConfigError, EngineConfig, parse_bytes
from schedlab.executor import Executor
from schedlab.plan import SchedulerConfig
from schedlab.scheduler import Scheduler
from schedlab.shapes import KVCacheSpec, ModelSpec

#: KV pool used when neither num_kv_blocks nor kv_cache_memory is set (and not on a GPU)
DEFAULT_KV_MEMORY = 1 << 30


def scheduler_limits(cfg: EngineConfig, sched_cls: type[Scheduler], spec: ModelSpec,
                     scheduler_name: str) -> SchedulerConfig:
    """The limits the scheduler plans under: `max_model_len` (default: the model's) and the
    token budget (default `DEFAULT_MAX_NUM_BATCHED_TOKENS`, raised to the whole length for a
    scheduler that does not chunk).

    Raises:
        ConfigError: a length past the model's, or a budget a whole prompt cannot fit in.
    """
    max_len = cfg.max_model_len or spec.max_position_embeddings
    if max_len > spec.max_position_embeddings:
        raise ConfigError(
            f"max_model_len={max_len} exceeds the model's max_position_embeddings="
            f"{spec.max_position_embeddings}"
        )
    budget = cfg.max_num_batched_tokens
    if budget is None:
        budget = DEFAULT_MAX_NUM_BATCHED_TOKENS
        if not sched_cls.chunks_prefill:
            budget = max(budget, max_len)
    if not sched_cls.chunks_prefill and budget < max_len:
        raise ConfigError(
            f"max_num_batched_tokens={budget} is smaller than max_model_len={max_len}: "
            f"scheduler {scheduler_name} runs a prompt in one step, so a long one could "
            "never run; raise max_num_batched_tokens, lower max_model_len, or use "
            "scheduler=chunked_prefill"
        )
    return SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_len,
        long_prefill_threshold=cfg.long_prefill_threshold,
    )


def num_kv_blocks(cfg: EngineConfig, kv_spec: KVCacheSpec, executor: Executor,
                  max_len: int) -> int:
    """Device KV blocks: `num_kv_blocks`, else `kv_cache_memory`, else what the executor
    offers, else enough for every seat at full length (capped at `DEFAULT_KV_MEMORY`).

    Raises:
        ConfigError: the memory holds no block.
    """
    if cfg.num_kv_blocks is not None:
        return cfg.num_kv_blocks
    if cfg.kv_cache_memory is not None:
        memory = parse_bytes(cfg.kv_cache_memory)
    else:
        offered = executor.available_kv_memory()
        # else enough for every seat at full length, capped at DEFAULT_KV_MEMORY
        memory = offered if offered is not None else min(
            DEFAULT_KV_MEMORY, kv_spec.bytes_for(max_len, cfg.max_num_seqs)
            + kv_spec.bytes_per_block)
    n = kv_spec.num_blocks_for(memory)
    if n <= 0:
        raise ConfigError(
            f"kv_cache_memory={memory} bytes holds no block: one block of {cfg.block_size} "
            f"tokens takes {kv_spec.bytes_per_block} bytes for this model"
        )
    return n


def num_swap_blocks(cfg: EngineConfig, kv_spec: KVCacheSpec) -> int:
    """Host blocks for swap preemption: swap_space over one block's bytes (0: recompute)."""
    if cfg.preemption_mode != "swap":
        return 0
    return parse_bytes(cfg.swap_space, "swap_space") // kv_spec.bytes_per_block
