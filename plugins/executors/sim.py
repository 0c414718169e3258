"""The simulated executor: the plan's cost predicted by the operator-level cost model, on a
virtual clock."""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any

from schedlab.clock import Clock, VirtualClock
from schedlab.config import ConfigError, EngineConfig
from schedlab.executor import Executor, ExecutorOutput
from schedlab.plan import PlanTotals, ScheduledRequest, SchedulerOutput
from schedlab.request import Request
from schedlab.shapes import KVCacheSpec, dtype_bytes
from schedlab.sim.costmodel import CostModel, StepShape
from schedlab.sim.hardware import HardwareProfile, resolve_hardware, with_overrides
from schedlab.sim.model_presets import ModelPreset, resolve_model
from schedlab.tokenizer import has_tokenizer, tiny_tokenizer_dir, visible_token_ids

_STOPS = attrgetter("request.sampling_params.stop_token_ids")
_OUTPUT = attrgetter("request.output_token_ids")


class SimExecutor(Executor):
    """Runs no model: each step's duration comes from `CostModel`, and the clock advances by it.

    The scheduler, queue, allocator and prefix cache are the same objects a real run uses; only
    the forward pass is replaced. Sampled tokens are placeholders that are never an EOS id, so
    output lengths follow each request's `max_tokens`.

    Args:
        config: the engine config; `model` is a preset name (`llama3_8b`, ...) or a local
            checkpoint directory (only its config.json is read).
        hardware: a preset name (`a100`, `h100`, `h200`, `cpu`), a profile JSON path, a
            `HardwareProfile`, or a dict of profile fields (optionally with `preset:`/`path:`
            as the base). Default `cpu`.
        tp: tensor-parallel degree.
        dtype: weight and KV dtype; default the hardware profile's.
        tokenizer: a local tokenizer directory for the output tokens (and the server's text);
            default the model directory's own, else the built-in tiny tokenizer.
        **overrides: any profile field (`linear_efficiency`, `step_overhead`, ...).
    """

    def __init__(
        self,
        config: EngineConfig,
        hardware: str | dict[str, Any] | HardwareProfile | None = None,
        tp: int = 1,
        dtype: str | None = None,
        tokenizer: str | None = None,
        **overrides: Any,
    ) -> None:
        self.config = config
        unknown = sorted(set(overrides) - {f.name for f in fields(HardwareProfile)})
        if unknown:
            raise ConfigError(
                f"executor=sim: unknown option(s) {unknown}; accepted: hardware, tp, dtype, "
                "tokenizer, and any hardware profile field (linear_efficiency, step_overhead, "
                "...: `schedlab.sim.hardware.HardwareProfile`)")
        try:
            self.preset: ModelPreset = resolve_model(config.model)
            self.hardware = with_overrides(resolve_hardware(hardware), overrides)
            self.dtype = dtype or self.hardware.dtype
            self.dtype_bytes = dtype_bytes(self.dtype)
            self.cost_model = CostModel(self.preset.spec, self.hardware, self.dtype_bytes, tp)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"executor=sim: {e}") from None
        self.model_spec = self.preset.spec
        #: decode padding charged by a profile measured on a padded backend: the profile's
        #: `decode_pad_waste`, or the attention options' when they set one
        self.pad_waste = self.hardware.decode_pad_waste
        if self.pad_waste is not None and "decode_pad_waste" in config.attention_options:
            self.pad_waste = float(config.attention_options["decode_pad_waste"])
        self.tp = tp
        #: decode-only steps of at most this many sequences replay a CUDA graph (GPU profiles,
        #: unless `enforce_eager`), as the torch executor captures them
        self.graph_max_seqs = 0
        if self.hardware.device == "cuda" and not config.enforce_eager:
            self.graph_max_seqs = max(config.cuda_graph_sizes or [config.max_num_seqs])
        self.clock: VirtualClock = VirtualClock()
        self.block_size = config.block_size
        eos = set(self.model_spec.eos_token_ids)
        self.placeholder = next(t for t in range(len(eos) + 1) if t not in eos)
        self._tokenizer = tokenizer
        self._words: list[int] | None = None

    def _own_tokenizer(self) -> str | None:
        if self._tokenizer is not None:
            return self._tokenizer
        return self.config.model if has_tokenizer(self.config.model) else None

    @property
    def tokenizer_path(self) -> str:
        """The tokenizer directory the output tokens come from (the tiny one saved on first
        use when neither the option nor the model names one)."""
        return self._own_tokenizer() or str(tiny_tokenizer_dir())

    def _all_words(self) -> list[int]:
        if self._words is None:  # NOTE: the tiny tokenizer in memory: a run needs no files
            self._words = visible_token_ids(self._own_tokenizer(), self.model_spec.vocab_size,
                                            set(self.model_spec.eos_token_ids))
        return self._words

    def _output_token(self, req: Request) -> int:
        stops = req.sampling_params.stop_token_ids
        words = [t for t in self._all_words() if t not in stops] if stops else self._all_words()
        if not words:
            return self._token_avoiding(stops) if stops else self.placeholder
        return words[req.num_output_tokens % len(words)]

    def kv_cache_spec(self, block_size: int) -> KVCacheSpec:
        s = self.model_spec
        return KVCacheSpec(s.num_layers, s.num_kv_heads, s.head_dim, self.dtype, block_size)

    def weight_bytes(self) -> int:
        """Bytes of weights on each device (linear layers split by TP, embeddings replicated)."""
        s, cm = self.model_spec, self.cost_model
        emb = s.vocab_size * s.hidden_size * self.dtype_bytes
        return int(cm.weight_bytes + cm.lm_head_bytes + (0 if s.tie_word_embeddings else emb))

    def available_kv_memory(self) -> int | None:
        hw = self.hardware
        if hw.device == "cpu":
            return None  # as the torch executor on a CPU: the engine's default pool
        per_device = hw.memory_capacity * self.config.gpu_memory_utilization
        left = per_device - self.weight_bytes()
        if left <= 0:
            raise ConfigError(
                f"model {self.preset.name!r} needs {self.weight_bytes() / 1e9:.1f} GB of weights "
                f"per device with tp={self.tp}, more than {per_device / 1e9:.1f} GB "
                f"({hw.name} x gpu_memory_utilization={self.config.gpu_memory_utilization}); "
                "raise tp"
            )
        # NOTE: the engine's pool counts whole-model bytes per token; each of the tp devices
        # holds 1/tp of every token's KV, so the pool is tp times one device's share.
        return int(left * self.tp)

    def set_clock(self, clock: Clock) -> None:
        """Run on `clock`, which must be a `VirtualClock`: the simulator moves time by each
        step's predicted duration.

        Raises:
            ConfigError: another kind of clock (a host clock would measure the simulator).
        """
        if not isinstance(clock, VirtualClock):
            raise ConfigError(
                f"executor=sim runs on a VirtualClock (it advances time by each step's predicted "
                f"duration), not a {type(clock).__name__}; use executor=torch to time a real "
                "model on a host clock")
        self.clock = clock

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size

    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        t, words = plan.totals, self._words
        if t is not None and self.pad_waste is None and words:
            out = self._from_totals(plan, t, words)
        else:  # padding, no totals or no visible words (the first step): walk the plan
            samples: list[bool] = []
            shape = StepShape.from_plan(plan, samples, self.pad_waste)
            graphs = shape.num_prefills == 0 and shape.num_seqs <= self.graph_max_seqs
            dt = self.cost_model.step_time(shape, self.block_size, graphs)
            out = ExecutorOutput(self._sample(plan.scheduled, samples), dt)
        self.clock.advance(out.step_time)
        return out

    def _from_totals(self, plan: SchedulerOutput, t: PlanTotals,
                     words: list[int]) -> ExecutorOutput:
        """The step costed from the plan's totals and one pass over its entries (their
        starts, the shapes of the chunks running more than one token) that samples as it
        goes: the same floats and tokens as walking the plan, bit for bit.

        NOTE: plain loops, not `map` over attrgetters: Python 3.11 specializes the slot reads.
        """
        scheduled = plan.rest
        n, nw = t.num_seqs, len(words)
        tokens = t.num_prefill_tokens + t.num_decode_tokens
        swapped = t.num_swap_in + len(plan.swap_out)
        out: list[int | None] = []
        add = out.append
        starts = 0
        run = plan.decode_run
        if run is not None:  # NOTE: one token each, each sampling: the loops' decode case
            starts = sum(run.starts)
            for r in run.requests:
                if r.sampling_params.stop_token_ids:
                    add(self._output_token(r))
                else:
                    add(words[len(r.output_token_ids) % nw])
        if tokens == n and t.num_sampled == n:  # one token each, every one sampled: decodes
            for sr in scheduled:
                r = sr.request
                starts += sr.start
                if r.sampling_params.stop_token_ids:
                    add(self._output_token(r))
                else:
                    add(words[len(r.output_token_ids) % nw])
            dt = self.cost_model.decode_step_time(n, n + starts, swapped, self.block_size,
                                                  n <= self.graph_max_seqs)
            return ExecutorOutput(out, dt)
        every = t.num_sampled == n
        num_prefills = pairs = pre_kv = 0
        for sr in scheduled:
            r = sr.request
            q, s = sr.num_new_tokens, sr.start
            starts += s
            if q > 1:
                num_prefills += 1
                pairs += q * s + q * (q + 1) // 2
                pre_kv += q + s
            output = r.output_token_ids
            if not every and s + q != len(r.prompt_token_ids) + len(output):
                add(None)
            elif r.sampling_params.stop_token_ids:
                add(self._output_token(r))
            else:
                add(words[len(output) % nw])
        kv = tokens + starts
        graphs = num_prefills == 0 and n <= self.graph_max_seqs
        dt = self.cost_model.counts_step_time(tokens, n, num_prefills, t.num_sampled, pairs,
                                              pre_kv, kv - pre_kv, swapped, self.block_size,
                                              graphs)
        return ExecutorOutput(out, dt)

    def _sample(self, scheduled: list[ScheduledRequest],
                samples: list[bool] | None) -> list[int | None]:
        """The placeholder token of each request that samples (`samples` None: every one):
        the next of the visible words, cycling with its output length (a request with stop
        ids: the next word not one)."""
        words = self._all_words()
        if words and (samples is None or all(samples)):  # NOTE: the common step at high load
            n = len(words)
            out: list[int | None] = []
            add = out.append
            for sr in scheduled:
                r = sr.request
                if r.sampling_params.stop_token_ids:
                    break
                add(words[len(r.output_token_ids) % n])
            else:
                return out
        if samples is None:
            samples = [True] * len(scheduled)
        if any(map(_STOPS, scheduled)):
            return [self._output_token(sr.request) if s else None
                    for sr, s in zip(scheduled, samples, strict=True)]
        if not words:
            return [self.placeholder if s else None for s in samples]
        n = len(words)
        counts = map(len, map(_OUTPUT, scheduled))
        return [words[k % n] if s else None for k, s in zip(counts, samples, strict=True)]

    def _token_avoiding(self, stops: list[int]) -> int:
        avoid = set(stops) | set(self.model_spec.eos_token_ids)
        return next(t for t in range(self.placeholder, self.placeholder + len(avoid) + 1)
                    if t not in avoid)
