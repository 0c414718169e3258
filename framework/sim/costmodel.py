"""An operator-level cost model of one engine step on named hardware.

A step is the sum of its operators (`schedlab.sim.operators`: the GEMMs with shape-dependent
efficiency, prefill and decode attention, KV-cache writes, the elementwise kernels, the LM head
and sampling) over the layers, plus TP all-reduces and swaps, plus the host: an eager forward
launches every kernel (on a GPU a step is launch-bound when that takes longer than the
kernels), a captured CUDA graph is one replay, and each step pays fixed host costs. With
tensor parallelism weights, heads and KV are split across `tp` devices. What it models and
what it leaves out: `ASSUMPTIONS.md` next to this file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import add, attrgetter, eq

from schedlab.plan import SchedulerOutput
from schedlab.shapes import ModelSpec, padded_decode_kv
from schedlab.sim import operators as op
from schedlab.sim.hardware import HardwareProfile

_NEW, _START = attrgetter("num_new_tokens"), attrgetter("start")
_PROMPT, _OUTPUT = attrgetter("request.prompt_token_ids"), attrgetter("request.output_token_ids")
_SWAP_IN = attrgetter("swap_in")


@dataclass(slots=True)
class StepShape:
    """The aggregates of one step's plan that its cost depends on: a value, built once per
    simulated step and only read (not frozen: a frozen one costs 5x more to build).

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
        decode_kv_tokens: the part of `kv_tokens` read by decodes (one-token queries).
    """

    num_tokens: int
    num_seqs: int
    num_prefills: int
    num_sampled: int
    attn_pairs: int
    kv_tokens: int
    num_swapped_blocks: int = 0
    padded_kv_tokens: int = -1
    decode_kv_tokens: int = 0

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
            decode_kv_tokens=sum(dec),
        )

    @classmethod
    def from_plan(cls, plan: SchedulerOutput, samples: list[bool] | None = None,
                  pad_waste: float | None = None) -> StepShape:
        """The plan's shape; `samples`, if given, receives whether each request samples;
        `pad_waste` as in `from_lens`. Sums over columns of the plan read with C-level
        getters (no per-request Python frames); a step of decodes only (the common one at
        high load) needs no per-sequence arithmetic, and the padded decode reads need the
        contexts sorted only when padding."""
        scheduled = plan.scheduled
        q = list(map(_NEW, scheduled))
        s = list(map(_START, scheduled))
        n, tokens, start_sum = len(q), sum(q), sum(s)
        ends = list(map(add, q, s))
        totals = map(add, map(len, map(_PROMPT, scheduled)), map(len, map(_OUTPUT, scheduled)))
        done = list(map(eq, ends, totals))
        if samples is not None:
            samples.extend(done)
        kv = tokens + start_sum
        if tokens == n:  # decodes only: each reads its context, start + 1
            dec, pre_pairs = ends, 0
        else:
            dec = [e for a, e in zip(q, ends, strict=True) if a == 1]
            pre_pairs = sum(a * b + a * (a + 1) // 2 for a, b in zip(q, s, strict=True) if a > 1)
        dec_kv = sum(dec)
        padded = kv if pad_waste is None else kv - dec_kv + padded_decode_kv(dec, pad_waste)
        return cls(tokens, n, n - len(dec), sum(done), pre_pairs + dec_kv, kv,
                   sum(map(len, map(_SWAP_IN, scheduled))) + len(plan.swap_out), padded, dec_kv)


@dataclass(frozen=True, slots=True)
class StepCost:
    """A step's predicted duration by term (seconds); `total` is their sum.

    The device terms are the operators of `schedlab.sim.operators` over all layers;
    `launch` is the host's launch time the device did not hide (all of it on a CPU, where
    host and device are one; on a GPU the part above the device time); `overhead` the fixed
    host costs per step, sequence and prefill.
    """

    gemm: float
    attention_prefill: float
    attention_decode: float
    kv_write: float
    elementwise: float
    lm_head: float
    sampling: float
    allreduce: float
    swap: float
    launch: float
    overhead: float

    @property
    def device(self) -> float:
        """The device's busy time: every term but the host's."""
        return (self.gemm + self.attention_prefill + self.attention_decode + self.kv_write
                + self.elementwise + self.lm_head + self.sampling + self.allreduce + self.swap)

    @property
    def total(self) -> float:
        return self.device + self.launch + self.overhead


class CostModel:
    """Predicts step durations of `spec` served on `tp` devices of `hw`.

    Args:
        spec: the model's shape.
        hw: the device profile (peaks, efficiencies, shape effects, overheads).
        dtype_bytes: bytes per weight and KV element (2 for bf16).
        tp: tensor-parallel degree.
    """

    def __init__(self, spec: ModelSpec, hw: HardwareProfile, dtype_bytes: int = 2,
                 tp: int = 1) -> None:
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp={tp!r} must be a positive integer")
        if spec.num_heads % tp:
            raise ValueError(f"tp={tp} does not divide the model's {spec.num_heads} heads")
        if tp > 1 and not hw.interconnect_bandwidth > 0:
            raise ValueError(f"tp={tp} all-reduces over the interconnect, and hardware "
                             f"{hw.name!r} has interconnect_bandwidth="
                             f"{hw.interconnect_bandwidth!r}; give it a positive one")
        self.spec, self.hw, self.tp, self.dtype_bytes = spec, hw, tp, dtype_bytes
        h, d, b = spec.hidden_size, spec.head_dim, dtype_bytes
        inter = spec.intermediate_size
        per_layer = h * d * 2 * (spec.num_heads + spec.num_kv_heads) + 3 * h * inter
        #: weights of the linear layers (attention projections and MLP), all layers
        self.linear_params = spec.num_layers * per_layer
        kv_heads = max(spec.num_kv_heads / tp, 1.0)  # KV heads are replicated below one per GPU
        self.weight_bytes = self.linear_params * b / tp
        self.lm_head_bytes = h * spec.vocab_size * b / tp
        #: (K, N) of each layer's GEMMs on one device: QKV, O, gate+up, down
        self.gemms = ((h, d * (spec.num_heads + 2 * spec.num_kv_heads) // tp),
                      (d * spec.num_heads // tp, h), (h, 2 * inter // tp), (inter // tp, h))
        self.heads = spec.num_heads // tp
        self.kv_bytes_per_token_layer = 2 * kv_heads * d * b
        self.kv_bytes_per_token = spec.num_layers * self.kv_bytes_per_token_layer
        self.kv_bytes_per_token_total = 2 * spec.num_layers * spec.num_kv_heads * d * b
        # per token and layer: 2 RMSNorms (read + write), RoPE on q and k, the gated
        # activation (read 2 x inter, write inter), 2 residual adds (read 2, write 1)
        q_width, kv_width = d * spec.num_heads / tp, d * kv_heads
        self.elementwise_bytes_per_token = b * (4 * h + 2 * (q_width + kv_width)
                                                + 3 * inter / tp + 6 * h)
        self._act_bytes_per_token = h * b
        self.kernels_per_step = spec.num_layers * op.KERNELS_PER_LAYER + op.KERNELS_PER_STEP
        #: the layers' GEMM, KV-write, elementwise and all-reduce times by the step's token
        #: count, and the LM head's by its rows: a step's cost is then O(1) dictionary work
        #: whatever its batch
        self._by_tokens: dict[int, tuple[float, float, float, float]] = {}
        self._lm_head_by_rows: dict[int, tuple[float, float]] = {}
        #: decode-only steps by their sequences: `token_terms`, `lm_head_time`, the overhead
        self._decode_by_seqs: dict[int, tuple[float, ...]] = {}
        self._eager_launch = self.kernels_per_step * hw.launch_overhead

    def token_terms(self, num_tokens: int) -> tuple[float, float, float, float]:
        """All layers' GEMMs, KV-cache writes, elementwise kernels and TP all-reduces at
        `num_tokens` rows (memoized)."""
        t = self._by_tokens.get(num_tokens)
        if t is None:
            hw, b, layers, n = self.hw, self.dtype_bytes, self.spec.num_layers, num_tokens
            gemm = layers * sum(op.gemm_time(hw, n, k, m, b) for k, m in self.gemms)
            ar = 0.0
            if self.tp > 1 and n:
                msg = n * self._act_bytes_per_token
                ring = 2 * (self.tp - 1) / self.tp * msg / hw.interconnect_bandwidth
                ar = 2 * layers * (ring / hw.interconnect_efficiency + hw.allreduce_latency)
            t = (gemm, layers * op.kv_write_time(hw, n, self.kv_bytes_per_token_layer),
                 layers * op.elementwise_time(hw, n, self.elementwise_bytes_per_token), ar)
            self._by_tokens[num_tokens] = t
        return t

    def lm_head_time(self, rows: int) -> tuple[float, float]:
        """The LM head's GEMM and sampling at `rows` sampled rows (memoized)."""
        t = self._lm_head_by_rows.get(rows)
        if t is None:
            spec, hw = self.spec, self.hw
            t = (op.lm_head_time(hw, rows, spec.hidden_size, spec.vocab_size // self.tp,
                                 self.dtype_bytes),
                 op.sampling_time(hw, rows, spec.vocab_size))
            self._lm_head_by_rows[rows] = t
        return t

    def step_cost(self, shape: StepShape, block_size: int, graphs: bool = False) -> StepCost:
        """The predicted duration of one step, by term. `graphs`: the step replays a
        captured CUDA graph instead of launching its kernels one by one."""
        return StepCost(*self._terms(shape, block_size, graphs)[:11])

    def step_time(self, shape: StepShape, block_size: int, graphs: bool = False) -> float:
        """`step_cost(...).total`, without building the breakdown."""
        t = self._terms(shape, block_size, graphs)
        return t[11] + t[9] + t[10]

    def decode_step_time(self, num_seqs: int, kv_tokens: int, num_swapped_blocks: int,
                         block_size: int, graphs: bool = False) -> float:
        """`counts_step_time` of `num_seqs` decodes that all sample, over `kv_tokens` context
        tokens in all: the common step at high load, its count terms and overhead one
        memo read (bit for bit the same floats)."""
        hw = self.hw
        c = self._decode_by_seqs.get(num_seqs)
        if c is None:
            if not num_seqs:
                return 0.0
            c = (*self.token_terms(num_seqs), *self.lm_head_time(num_seqs),
                 hw.step_overhead + hw.seq_overhead * num_seqs + hw.prefill_overhead * 0)
            self._decode_by_seqs[num_seqs] = c
        gemm, kv_write, elem, ar, lm_head, sampling, overhead = c
        attn_dec = self.spec.num_layers * op.attention_decode_time(
            hw, kv_tokens, self.heads, self.spec.head_dim, self.kv_bytes_per_token_layer)
        swap = self.swap_time(num_swapped_blocks, block_size) if num_swapped_blocks else 0.0
        # NOTE: `_terms`'s sums in its order, less its prefill attention (0.0: gemm + 0.0 is
        # gemm)
        device = gemm + attn_dec + kv_write + elem + lm_head + sampling + ar + swap
        return device + self._host_time(device, graphs) + overhead

    def counts_step_time(self, num_tokens: int, num_seqs: int, num_prefills: int,
                         num_sampled: int, prefill_pairs: int, prefill_kv_tokens: int,
                         decode_kv_tokens: int, num_swapped_blocks: int, block_size: int,
                         graphs: bool = False) -> float:
        """`step_time` of the step these aggregates describe, decodes unpadded, no
        `StepShape` built: what the simulator computes per step (bit for bit the same).

        Args:
            num_tokens, num_seqs, num_prefills, num_sampled, num_swapped_blocks: as in
                `StepShape`.
            prefill_pairs: causal (query, key) pairs of the sequences running more than one
                token; prefill_kv_tokens: their context tokens (start + new tokens).
            decode_kv_tokens: context tokens of the one-token queries.
            block_size, graphs: as in `step_cost`.
        """
        if not num_seqs:
            return 0.0
        hw = self.hw
        # NOTE: a memo hit costs a dictionary read, not a call
        gemm, kv_write, elem, ar = (self._by_tokens.get(num_tokens)
                                    or self.token_terms(num_tokens))
        lm_head, sampling = (self._lm_head_by_rows.get(num_sampled)
                             or self.lm_head_time(num_sampled))
        layers, kvb = self.spec.num_layers, self.kv_bytes_per_token_layer
        attn_pre = 0.0 if prefill_pairs <= 0 else layers * op.attention_prefill_time(
            hw, prefill_pairs, prefill_kv_tokens, self.heads, self.spec.head_dim, kvb)
        attn_dec = layers * op.attention_decode_time(hw, decode_kv_tokens, self.heads,
                                                     self.spec.head_dim, kvb)
        swap = self.swap_time(num_swapped_blocks, block_size) if num_swapped_blocks else 0.0
        # NOTE: `_terms`'s sums in its order: the same floats, bit for bit
        device = gemm + attn_pre + attn_dec + kv_write + elem + lm_head + sampling + ar + swap
        return device + self._host_time(device, graphs) + (
            hw.step_overhead + hw.seq_overhead * num_seqs + hw.prefill_overhead * num_prefills)

    def _host_time(self, device: float, graphs: bool) -> float:
        """A step's launch cost beside its `device` work: a graph replay's or the eager
        launches'; on a GPU only the part the device work does not hide."""
        hw = self.hw
        host = hw.graph_launch_overhead if graphs else self._eager_launch
        if hw.device != "cpu":
            host = max(0.0, host - device)
        return host

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Copying `num_blocks` KV blocks of `block_size` tokens between host and device."""
        if not num_blocks:
            return 0.0
        nbytes = num_blocks * block_size * self.kv_bytes_per_token_total
        return nbytes / self.tp / self.hw.host_bandwidth

    def _terms(self, shape: StepShape, block_size: int,
               graphs: bool) -> tuple[float, ...]:
        """`StepCost`'s terms in its order, then their device sum (as `StepCost.device`)."""
        hw, spec, layers = self.hw, self.spec, self.spec.num_layers
        n = shape.num_tokens
        if not shape.num_seqs:
            return (0.0,) * 12
        dec_kv = shape.decode_kv_tokens
        pre_pairs = shape.attn_pairs - dec_kv
        pre_kv = shape.kv_tokens - dec_kv
        if hw.decode_pad_waste is not None and shape.padded_kv_tokens >= 0:
            dec_kv = shape.padded_kv_tokens - pre_kv
        kvb, d = self.kv_bytes_per_token_layer, spec.head_dim
        attn_pre = 0.0 if pre_pairs <= 0 else layers * op.attention_prefill_time(
            hw, pre_pairs, pre_kv, self.heads, d, kvb)  # NOTE: the function's own 0 for none
        attn_dec = layers * op.attention_decode_time(hw, dec_kv, self.heads, d, kvb)
        gemm, kv_write, elem, ar = self.token_terms(n)
        lm_head, sampling = self.lm_head_time(shape.num_sampled)
        swap = self.swap_time(shape.num_swapped_blocks, block_size)
        # NOTE: `StepCost.device`'s sum, in its order
        device = gemm + attn_pre + attn_dec + kv_write + elem + lm_head + sampling + ar + swap
        host = self._host_time(device, graphs)
        return (gemm, attn_pre, attn_dec, kv_write, elem, lm_head, sampling, ar, swap, host,
                hw.step_overhead + hw.seq_overhead * shape.num_seqs
                + hw.prefill_overhead * shape.num_prefills, device)
