"""The operators of one transformer step, each timed on its own from a hardware profile.

Every function returns seconds for ONE call of the operator on one device (one layer's worth;
`CostModel` multiplies by the layers). They are the terms of the step breakdown and what
`schedlab calibrate` fits per operator (see `schedlab.calibration.profile_csv`).

A GEMM of M rows (tokens) by a K x N weight takes the roofline's compute and memory times,
but neither bound is reached near the ridge point: the two are combined as a p-norm
(`gemm_ridge_sharpness`; infinity is the plain roofline max), so small-M GEMMs fall below
both bounds; and the GPU computes whole tiles of `gemm_tile_m` rows (tile quantization), a
floor on the time once M passes a tile boundary.
"""

from __future__ import annotations

import math

from schedlab.sim.hardware import HardwareProfile

#: the operators of a step, in breakdown order (the names `StepCost` and the CSV format use)
OPERATORS = ("gemm", "attention_prefill", "attention_decode", "kv_write", "elementwise",
             "lm_head", "sampling")

#: device kernels per layer outside the GEMMs and attention: two RMSNorms, RoPE, the gated
#: activation, two residual adds, the KV-cache write
ELEMENTWISE_KERNELS = 6
#: kernels launched per layer in an eager forward (4 GEMMs, attention, the ones above, KV write)
KERNELS_PER_LAYER = 4 + 1 + ELEMENTWISE_KERNELS + 1
#: kernels per step outside the layers (embedding, final norm, LM head, sampling)
KERNELS_PER_STEP = 4


def combine(compute: float, memory: float, p: float) -> float:
    """Time of an operator bound by `compute` and `memory` seconds: their p-norm (>= the
    larger; p = inf gives max, the roofline)."""
    if math.isinf(p) or compute == 0.0 or memory == 0.0:
        return max(compute, memory)
    hi = max(compute, memory)
    return hi * ((compute / hi) ** p + (memory / hi) ** p) ** (1.0 / p)


def gemm_time(hw: HardwareProfile, m: int, k: int, n: int, dtype_bytes: int) -> float:
    """One [m, k] x [k, n] matmul: tile-quantized FLOPs at `linear_efficiency` of peak,
    weights and activations at `memory_efficiency` of the bandwidth, combined near the
    ridge (`combine` with `gemm_ridge_sharpness`), plus one kernel's least time."""
    if m <= 0:
        return 0.0
    flop_time = 2.0 * k * n / (hw.matmul_flops * hw.linear_efficiency)
    memory = (k * n + m * (k + n)) * dtype_bytes / (hw.mem_bandwidth * hw.memory_efficiency)
    tile = hw.gemm_tile_m
    tiled = -(-m // tile) * tile * flop_time  # the whole tiles the GPU computes
    return max(combine(m * flop_time, memory, hw.gemm_ridge_sharpness), tiled) + hw.kernel_time


def attention_prefill_time(hw: HardwareProfile, pairs: int, kv_tokens: int, heads: int,
                           head_dim: int, kv_bytes_per_token: float) -> float:
    """One layer's attention over prefill chunks: `pairs` causal (query, key) pairs of
    `heads` heads (QK^T and PV: 4 FLOPs per pair and dim) and `kv_tokens` K/V read."""
    if pairs <= 0:
        return 0.0
    compute = 4.0 * pairs * heads * head_dim / (hw.matmul_flops * hw.attention_efficiency)
    memory = kv_tokens * kv_bytes_per_token / (hw.mem_bandwidth * hw.kv_efficiency)
    return max(compute, memory) + hw.kernel_time


def attention_decode_time(hw: HardwareProfile, kv_tokens: int, heads: int, head_dim: int,
                          kv_bytes_per_token: float) -> float:
    """One layer's attention of single-token queries reading `kv_tokens` K/V in all."""
    if kv_tokens <= 0:
        return 0.0
    compute = 4.0 * kv_tokens * heads * head_dim / (hw.matmul_flops * hw.attention_efficiency)
    memory = kv_tokens * kv_bytes_per_token / (hw.mem_bandwidth * hw.kv_efficiency)
    return max(compute, memory) + hw.kernel_time


def kv_write_time(hw: HardwareProfile, tokens: int, kv_bytes_per_token: float) -> float:
    """One layer's scatter of `tokens` new K/V entries into cache blocks."""
    if tokens <= 0:
        return 0.0
    return (tokens * kv_bytes_per_token / (hw.mem_bandwidth * hw.kv_write_efficiency)
            + hw.kernel_time)


def elementwise_time(hw: HardwareProfile, tokens: int, bytes_per_token: float) -> float:
    """One layer's elementwise kernels (norms, RoPE, activation, residual adds) over `tokens`
    rows moving `bytes_per_token` each, plus each kernel's minimum device time."""
    if tokens <= 0:
        return 0.0
    return (tokens * bytes_per_token / (hw.mem_bandwidth * hw.elementwise_efficiency)
            + (ELEMENTWISE_KERNELS - 1) * hw.kernel_time)


def lm_head_time(hw: HardwareProfile, rows: int, hidden: int, vocab: int,
                 dtype_bytes: int) -> float:
    """The logits of `rows` sampled positions: a GEMM against the vocabulary."""
    return gemm_time(hw, rows, hidden, vocab, dtype_bytes)


def sampling_time(hw: HardwareProfile, rows: int, vocab: int) -> float:
    """Softmax / argmax over `rows` float32 logit rows (read twice) and the token copy."""
    if rows <= 0:
        return 0.0
    return (2 * 4 * rows * vocab / (hw.mem_bandwidth * hw.memory_efficiency)
            + 2 * hw.kernel_time)
