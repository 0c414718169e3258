"""The engine's configuration: one frozen dataclass, validated once, passed down."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

PREEMPTION_MODES = ("recompute", "swap")
#: tokens per KV block when none is configured: the one source of this default
DEFAULT_BLOCK_SIZE = 16
#: the token budget per step when `max_num_batched_tokens` is None (a scheduler that does not
#: chunk prefills gets at least `max_model_len`): the one source of this default
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEVICES = ("cpu", "cuda")
#: the dtype names the engine takes, float32 / float16 / bfloat16 then their short names
#: (`schedlab.model.DTYPES` maps them to torch dtypes; checking them here needs no torch)
DTYPE_NAMES = ("float32", "float16", "bfloat16", "fp32", "fp16", "bf16")

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


class ConfigError(ValueError):
    """A bad configuration value. The message names the key, the value and what is accepted."""


def parse_bytes(value: int | float | str, key: str = "kv_cache_memory") -> int:
    """`1073741824`, `"1GiB"`, `"512MiB"`, `"2GB"` -> bytes."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ConfigError(f"{key}={value!r} is not a size; use bytes or e.g. '512MiB', '2GiB'")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ConfigError(f"{key}={value!r} must be positive")
    return n


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything `LLM(...)` and `schedlab run` accept, with vLLM's names where vLLM has one.

    A plugin field takes a registered name (`"fcfs"`), a `"module:Class"` path or the class
    itself; `*_options` are passed to the plugin's constructor as keyword arguments.
    """

    model: str
    scheduler: str | type = "continuous"
    kv_allocator: str | type = "paged"
    prefix_cache: str | type = "none"
    attention: str | type = "sdpa"
    queue: str | type = "fcfs"
    executor: str | type = "torch"
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    num_kv_blocks: int | None = None
    kv_cache_memory: int | str | None = None
    gpu_memory_utilization: float = 0.9
    long_prefill_threshold: int = 0
    preemption_mode: str = "recompute"
    swap_space: int | str = "1GiB"
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    enforce_eager: bool = False
    cuda_graph_sizes: list[int] = field(default_factory=list)
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    queue_options: dict[str, Any] = field(default_factory=dict)
    kv_allocator_options: dict[str, Any] = field(default_factory=dict)
    prefix_cache_options: dict[str, Any] = field(default_factory=dict)
    attention_options: dict[str, Any] = field(default_factory=dict)
    executor_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def positive(key: str, allow_none: bool = False) -> None:
            v = getattr(self, key)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{key}={v!r} must be a positive integer")

        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"model={self.model!r} must be a checkpoint directory or preset name")
        for kind in ("scheduler", "kv_allocator", "prefix_cache", "attention", "queue",
                     "executor", "dtype", "device"):
            plugin = kind not in ("dtype", "device")
            value = getattr(self, kind)
            if not isinstance(value, str) and not (plugin and isinstance(value, type)):
                raise ConfigError(f"{kind}={value!r} must be a name (a string)" + (
                    ", a 'module:Class' path or a class" if plugin else ""))
            if plugin:
                options = getattr(self, f"{kind}_options")
                if not isinstance(options, Mapping):
                    raise ConfigError(f"{kind}_options={options!r} must be a mapping of "
                                      "keyword arguments")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed={self.seed!r} must be an integer")
        if isinstance(self.gpu_memory_utilization, bool) or not isinstance(
            self.gpu_memory_utilization, int | float
        ):
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be "
                              "a number in (0, 1]")
        positive("block_size")
        positive("max_num_seqs")
        positive("max_num_batched_tokens", allow_none=True)
        positive("max_model_len", allow_none=True)
        positive("num_kv_blocks", allow_none=True)
        if not isinstance(self.enforce_eager, bool):
            raise ConfigError(f"enforce_eager={self.enforce_eager!r} must be true or false")
        sizes = self.cuda_graph_sizes
        if isinstance(sizes, str | bytes) or not isinstance(sizes, Sequence) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes):
            raise ConfigError(f"cuda_graph_sizes={sizes!r} must be a list of positive integers "
                              "(batch sizes captured as CUDA graphs; [] or [N]: 1, 2, 4, 8, "
                              "16, ... up to N or max_num_seqs)")
        if self.kv_cache_memory is not None:
            parse_bytes(self.kv_cache_memory)
        parse_bytes(self.swap_space, "swap_space")
        if self.block_size & (self.block_size - 1):
            raise ConfigError(
                f"block_size={self.block_size} must be a power of two (1, 2, 4, 8, 16, ...)"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ConfigError(
                f"preemption_mode={self.preemption_mode!r}; accepted: {', '.join(PREEMPTION_MODES)}"
            )
        if self.device.split(":")[0] not in DEVICES:
            raise ConfigError(f"device={self.device!r}; accepted: cpu, cuda, cuda:N")
        if not isinstance(self.long_prefill_threshold, int) or self.long_prefill_threshold < 0:
            raise ConfigError(
                f"long_prefill_threshold={self.long_prefill_threshold!r} must be an integer >= 0"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]"
            )
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(f"dtype={self.dtype!r}; accepted: {', '.join(DTYPE_NAMES)}")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
