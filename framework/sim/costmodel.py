"""A roofline cost model of one engine step: linear layers, attention, logits, TP all-reduce.

Each term takes max(compute time, memory time), the peaks scaled by the profile's efficiency
factors. With tensor parallelism the weights, heads and KV are split across `tp` devices and
every layer pays two all-reduces of the step's activations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedlab.plan import SchedulerOutput
from schedlab.shapes import ModelSpec, padded_decode_kv
from schedlab.sim.hardware import HardwareProfile


@dataclass(frozen=True, slots=True)
class StepShape:
    """The aggregates of one step's plan that its cost depends on.

    Args:
        num_tokens: tokens run (prefill chunks plus decodes).
        num_seqs: sequences scheduled.
        num_prefills: sequences running more than one token.
        num_sampled: sequences that sample a token (logits rows).
        attn_pairs: causal (query, key) pairs summed over sequences.
        kv_tokens: context tokens whose K/V is read, summed over sequences.
        num_swapped_blocks: KV blocks copied between host and device before the step.
        padded_kv_tokens: `kv_tokens` when decodes are attended in padded groups, longest
            context first, as `schedlab.shapes.padded_decode_groups` cuts them with the
            backend's `decode_pad_waste` (`kv_tokens` when none was given).
    """

    num_tokens: int
    num_seqs: int
    num_prefills: int
    num_sampled: int
    attn_pairs: int
    kv_tokens: int
    num_swapped_blocks: int = 0
    padded_kv_tokens: int = -1

    @classmethod
    def from_lens(cls, query_lens: Sequence[int], starts: Sequence[int],
                  sampled: Sequence[bool] | None = None,
                  pad_waste: float | None = None) -> StepShape:
        """Sequences running `query_lens[i]` tokens after `starts[i]` cached ones; decodes
        padded as a backend with `decode_pad_waste=pad_waste` pads them (None: no padding)."""
        pairs = sum(q * s + q * (q + 1) // 2 for q, s in zip(query_lens, starts, strict=True))
        ctx = [q + s for q, s in zip(query_lens, starts, strict=True)]
        dec = [c for q, c in zip(query_lens, ctx, strict=True) if q == 1]
        kv = sum(ctx)
        return cls(
            num_tokens=sum(query_lens),
            num_seqs=len(query_lens),
            num_prefills=sum(1 for q in query_lens if q > 1),
            num_sampled=len(query_lens) if sampled is None else sum(map(bool, sampled)),
            attn_pairs=pairs,
            kv_tokens=kv,
            padded_kv_tokens=kv - sum(dec) + padded_decode_kv(dec, pad_waste),
        )

    @classmethod
    def from_plan(cls, plan: SchedulerOutput, samples: list[bool] | None = None,
                  pad_waste: float | None = None) -> StepShape:
        """The plan's shape; `samples`, if given, receives whether each request samples;
        `pad_waste` as in `from_lens`."""
        tokens = prefills = sampled = pairs = kv = dec_kv = 0
        dec: list[int] = []
        for sr in plan.scheduled:
            q, s = sr.num_new_tokens, sr.start
            tokens += q
            kv += q + s
            if q == 1:
                pairs += s + 1
                dec_kv += s + 1
                dec.append(s + 1)
            else:
                prefills += 1
                pairs += q * s + q * (q + 1) // 2
            done = s + q == sr.request.num_tokens
            sampled += done
            if samples is not None:
                samples.append(done)
        return cls(tokens, len(plan.scheduled), prefills, sampled, pairs, kv,
                   len(plan.swap_in) + len(plan.swap_out),
                   kv - dec_kv + padded_decode_kv(dec, pad_waste))


@dataclass(frozen=True, slots=True)
class RawTerms:
    """Seconds each part of a step would take at 100% of peak (the calibration features)."""

    linear_compute: float
    linear_memory: float
    attention_compute: float
    attention_memory: float
    logits_compute: float
    logits_memory: float
    allreduce: float
    swap: float


@dataclass(frozen=True, slots=True)
class StepCost:
    """A step's predicted duration by term (seconds); `total` is their sum."""

    linear: float
    attention: float
    logits: float
    allreduce: float
    swap: float
    overhead: float

    @property
    def total(self) -> float:
        return (self.linear + self.attention + self.logits + self.allreduce + self.swap
                + self.overhead)


class CostModel:
    """Predicts step durations of `spec` served on `tp` devices of `hw`.

    Args:
        spec: the model's shape.
        hw: the device profile (peaks, efficiencies, overheads).
        dtype_bytes: bytes per weight and KV element (2 for bf16).
        tp: tensor-parallel degree.
    """

    def __init__(self, spec: ModelSpec, hw: HardwareProfile, dtype_bytes: int = 2,
                 tp: int = 1) -> None:
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp={tp!r} must be a positive integer")
        if spec.num_heads % tp:
            raise ValueError(f"tp={tp} does not divide the model's {spec.num_heads} heads")
        self.spec, self.hw, self.tp, self.dtype_bytes = spec, hw, tp, dtype_bytes
        h, d, b = spec.hidden_size, spec.head_dim, dtype_bytes
        per_layer = (h * d * 2 * (spec.num_heads + spec.num_kv_heads)
                     + 3 * h * spec.intermediate_size)
        #: weights of the linear layers (attention projections and MLP), all layers
        self.linear_params = spec.num_layers * per_layer
        kv_heads = max(spec.num_kv_heads / tp, 1.0)  # KV heads are replicated below one per GPU
        self.weight_bytes = self.linear_params * b / tp
        self.linear_flops_per_token = 2 * self.linear_params / tp
        self.attn_flops_per_pair = 4 * spec.num_layers * spec.num_heads * d / tp
        self.kv_bytes_per_token = 2 * spec.num_layers * kv_heads * d * b
        self.logits_flops_per_row = 2 * h * spec.vocab_size / tp
        self.lm_head_bytes = h * spec.vocab_size * b / tp
        self.kv_bytes_per_token_total = 2 * spec.num_layers * spec.num_kv_heads * d * b
        self._act_bytes_per_token = h * b

    def raw_terms(self, shape: StepShape, block_size: int) -> RawTerms:
        """Each term's compute and memory time at peak, before efficiencies."""
        hw = self.hw
        flops, bw = hw.matmul_flops, hw.mem_bandwidth
        ar = 0.0
        if self.tp > 1 and shape.num_tokens:
            msg = shape.num_tokens * self._act_bytes_per_token
            ring = 2 * (self.tp - 1) / self.tp * msg / hw.interconnect_bandwidth
            ar = 2 * self.spec.num_layers * ring
        swap = 0.0
        if shape.num_swapped_blocks:
            nbytes = shape.num_swapped_blocks * block_size * self.kv_bytes_per_token_total
            swap = nbytes / self.tp / hw.host_bandwidth
        sampled = shape.num_sampled
        kv_tokens = shape.kv_tokens
        if hw.decode_pad_waste is not None and shape.padded_kv_tokens >= 0:
            kv_tokens = shape.padded_kv_tokens
        return RawTerms(
            linear_compute=shape.num_tokens * self.linear_flops_per_token / flops,
            linear_memory=self.weight_bytes / bw if shape.num_tokens else 0.0,
            attention_compute=shape.attn_pairs * self.attn_flops_per_pair / flops,
            attention_memory=kv_tokens * self.kv_bytes_per_token / bw,
            logits_compute=sampled * self.logits_flops_per_row / flops,
            logits_memory=self.lm_head_bytes / bw if sampled else 0.0,
            allreduce=ar,
            swap=swap,
        )

    def step_cost(self, shape: StepShape, block_size: int) -> StepCost:
        """The predicted duration of one step, by term."""
        hw = self.hw
        r = self.raw_terms(shape, block_size)
        el, ea, em = hw.linear_efficiency, hw.attention_efficiency, hw.memory_efficiency
        ek = hw.kv_efficiency
        ar = 0.0
        if self.tp > 1 and shape.num_tokens:
            ar = r.allreduce / hw.interconnect_efficiency + 2 * self.spec.num_layers * (
                hw.allreduce_latency)
        overhead = 0.0
        if shape.num_seqs:
            overhead = (hw.step_overhead + hw.seq_overhead * shape.num_seqs
                        + hw.prefill_overhead * shape.num_prefills)
        return StepCost(
            linear=max(r.linear_compute / el, r.linear_memory / em),
            attention=max(r.attention_compute / ea, r.attention_memory / ek),
            logits=max(r.logits_compute / el, r.logits_memory / em),
            allreduce=ar,
            swap=r.swap,
            overhead=overhead,
        )

    def step_time(self, shape: StepShape, block_size: int) -> float:
        return self.step_cost(shape, block_size).total
