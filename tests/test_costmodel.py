"""The cost model's terms on hand-computed cases, hardware profiles, model presets, calibration."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from schedlab.calibration.costfit import fit_profile, nnls
from schedlab.config import DEFAULT_BLOCK_SIZE as BS
from schedlab.plan import ScheduledRequest, SchedulerOutput
from schedlab.request import Request, SamplingParams
from schedlab.shapes import ModelSpec
from schedlab.sim import operators as op
from schedlab.sim.costmodel import CostModel, StepShape
from schedlab.sim.hardware import (
    PRESETS,
    UNFITTED_SHAPE_TERMS,
    HardwareProfile,
    resolve_hardware,
)
from schedlab.sim.model_presets import PRESETS as MODELS
from schedlab.sim.model_presets import load_config_dir, resolve_model

LLAMA8B = MODELS["llama3_8b"].spec
H100 = PRESETS["h100"]
#: a profile at 100% of peak, a pure roofline and no overheads, for exact hand computations
IDEAL = replace(H100, linear_efficiency=1.0, attention_efficiency=1.0, memory_efficiency=1.0,
                kv_efficiency=1.0, interconnect_efficiency=1.0, step_overhead=0.0,
                seq_overhead=0.0, prefill_overhead=0.0, allreduce_latency=0.0,
                **UNFITTED_SHAPE_TERMS)


def test_presets_have_the_real_parameter_counts():
    assert MODELS["llama3_8b"].spec.num_params == pytest.approx(8.03e9, rel=0.01)
    assert MODELS["llama3_70b"].spec.num_params == pytest.approx(70.6e9, rel=0.01)
    assert MODELS["qwen2_5_7b"].spec.num_params == pytest.approx(7.6e9, rel=0.02)
    assert all(m.dtype == "bfloat16" for m in MODELS.values())


def test_decode_is_bounded_below_by_reading_the_weights():
    cm = CostModel(LLAMA8B, H100, dtype_bytes=2)
    shape = StepShape.from_lens([1], [1023])
    weights = cm.linear_params * 2
    t = cm.step_time(shape, BS)
    assert t >= weights / H100.mem_bandwidth
    assert t < 3 * weights / H100.mem_bandwidth  # still a memory-bound step, not more
    cost = cm.step_cost(shape, BS)
    kernels = 4 * LLAMA8B.num_layers * H100.kernel_time  # each GEMM's least time
    assert cost.gemm - kernels == pytest.approx(
        weights / (H100.mem_bandwidth * H100.memory_efficiency), rel=0.01)
    terms = [getattr(cost, k) for k in (*op.OPERATORS, "allreduce", "swap")]
    assert cost.device == pytest.approx(sum(terms))
    assert cost.total == pytest.approx(cost.device + cost.launch + cost.overhead)


def test_large_prefill_costs_two_flops_per_parameter_per_token():
    cm = CostModel(LLAMA8B, IDEAL, dtype_bytes=2)
    n = 2048
    non_embedding = LLAMA8B.num_params - 2 * LLAMA8B.vocab_size * LLAMA8B.hidden_size
    cost = cm.step_cost(StepShape.from_lens([n], [0]), BS)
    t = cost.total
    assert cost.gemm + cost.lm_head == pytest.approx(2 * non_embedding * n / IDEAL.matmul_flops,
                                                     rel=0.08)
    # and a prefill is compute-bound: doubling the tokens nearly doubles the time
    assert cm.step_time(StepShape.from_lens([2 * n], [0]), BS) / t == pytest.approx(2, rel=0.1)


def test_attention_counts_causal_pairs_and_context_reads():
    cm = CostModel(LLAMA8B, IDEAL, dtype_bytes=2)
    s = StepShape.from_lens([4, 1], [0, 9])
    assert s.attn_pairs == (1 + 2 + 3 + 4) + 10
    assert s.kv_tokens == 4 + 10
    assert (s.num_tokens, s.num_seqs, s.num_prefills, s.num_sampled) == (5, 2, 1, 2)
    c = cm.step_cost(s, BS)
    spec = LLAMA8B
    per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
    flops = 4 * spec.num_layers * spec.num_heads * spec.head_dim
    # the prefill's 10 pairs are compute-bound at peak, the decode reads 10 tokens' K/V
    assert c.attention_prefill == pytest.approx(
        max(flops * 10 / IDEAL.matmul_flops, per_token * 4 / IDEAL.mem_bandwidth))
    assert c.attention_decode == pytest.approx(per_token * 10 / IDEAL.mem_bandwidth)
    # and every new token's K/V is written once
    assert c.kv_write == pytest.approx(per_token * 5 / IDEAL.mem_bandwidth)


def test_logits_only_for_sampled_positions():
    cm = CostModel(LLAMA8B, IDEAL, dtype_bytes=2)
    partial = StepShape.from_lens([512], [0], sampled=[False])
    full = StepShape.from_lens([512], [0], sampled=[True])
    assert cm.step_cost(partial, BS).lm_head == cm.step_cost(partial, BS).sampling == 0.0
    assert cm.step_cost(full, BS).lm_head > 0.0 and cm.step_cost(full, BS).sampling > 0.0


def test_tensor_parallel_halves_weight_time_and_adds_allreduce():
    decode = StepShape.from_lens([1] * 8, [500] * 8)
    one = CostModel(LLAMA8B, H100, 2, tp=1).step_cost(decode, BS)
    two = CostModel(LLAMA8B, H100, 2, tp=2).step_cost(decode, BS)
    floor = LLAMA8B.num_layers * H100.kernel_time  # per GEMM or attention call, not split
    assert two.gemm - 4 * floor == pytest.approx((one.gemm - 4 * floor) / 2, rel=0.01)
    assert two.attention_decode - floor == pytest.approx((one.attention_decode - floor) / 2)
    assert one.allreduce == 0.0 and two.allreduce > 0.0
    with pytest.raises(ValueError, match="tp=5"):
        CostModel(LLAMA8B, H100, 2, tp=5)


def test_step_shape_from_plan_matches_lengths():
    sp = SamplingParams(max_tokens=8)
    a = Request("a", list(range(100)), sp)  # prefill chunk 0..64 of 100: no sample
    b = Request("b", list(range(20)), sp)
    b.output_token_ids = [1, 2, 3]  # decode at position 22
    plan = SchedulerOutput([ScheduledRequest(a, 64, 0, []), ScheduledRequest(b, 1, 22, [])])
    assert StepShape.from_plan(plan) == StepShape.from_lens([64, 1], [0, 22], [False, True])


@pytest.mark.parametrize("hw", [H100, PRESETS["a100"], replace(PRESETS["h200"], device="cpu")],
                         ids=["h100", "a100", "cpu-device"])
@pytest.mark.parametrize("tp", [1, 2])
def test_counts_step_time_is_step_time_bit_for_bit(hw, tp):
    """The simulator's per-step paths (aggregates, no `StepShape`) and the breakdown's total
    are the same floats: decode-only and mixed steps, swaps, graphs or not."""
    cm = CostModel(LLAMA8B, hw, 2, tp)
    cases = [([1] * 26, [70 + 13 * i for i in range(26)]), ([1], [0]), ([512], [0]),
             ([1] * 5 + [300], [40, 41, 900, 3, 17, 256]), ([7, 1, 64], [0, 33, 128])]
    for lens, starts in cases:
        for sampled in ([True] * len(lens), [True] * (len(lens) - 1) + [False]):
            for swapped in (0, 3):
                shape = replace(StepShape.from_lens(lens, starts, sampled),
                                num_swapped_blocks=swapped)
                many = [(q, s) for q, s in zip(lens, starts, strict=True) if q > 1]
                pairs = sum(q * s + q * (q + 1) // 2 for q, s in many)
                pre_kv = sum(q + s for q, s in many)
                for graphs in (False, True) if not many else (False,):
                    got = cm.counts_step_time(
                        shape.num_tokens, shape.num_seqs, len(many), shape.num_sampled, pairs,
                        pre_kv, shape.kv_tokens - pre_kv, swapped, BS, graphs)
                    assert got == cm.step_time(shape, BS, graphs) == cm.step_cost(
                        shape, BS, graphs).total, (lens, sampled, swapped, graphs)
                    if not many and all(sampled):
                        assert got == cm.decode_step_time(len(lens), shape.kv_tokens, swapped,
                                                          BS, graphs)
    assert cm.counts_step_time(0, 0, 0, 0, 0, 0, 0, 0, BS) == 0.0
    assert cm.decode_step_time(0, 0, 0, BS) == 0.0


def test_padded_decode_attention_reads_up_to_the_longest_context():
    shape = StepShape.from_lens([1, 1, 8], [99, 9, 0], pad_waste=float("inf"))
    assert (shape.kv_tokens, shape.padded_kv_tokens) == (100 + 10 + 8, 2 * 100 + 8)
    paged = CostModel(LLAMA8B, IDEAL, 2).step_cost(shape, BS)
    padded = CostModel(LLAMA8B, replace(IDEAL, decode_pad_waste=0.25), 2).step_cost(shape, BS)
    assert padded.attention_decode / paged.attention_decode == pytest.approx(200 / 110)


def test_padded_decode_attention_pads_as_the_backend_declares():
    # ten decodes, longest first: 100, 90, ..., 10; with 25% padding allowed a group grows
    # while rows x its longest <= 1.25 x its tokens: [100..60], [50, 40, 30], [20], [10]
    ctx = [10 * i for i in range(10, 0, -1)]
    shape = StepShape.from_lens([1] * 10, [c - 1 for c in ctx], pad_waste=0.25)
    assert shape.kv_tokens == 550
    assert shape.padded_kv_tokens == 5 * 100 + 3 * 50 + 20 + 10
    assert StepShape.from_lens([1] * 10, [c - 1 for c in ctx]).padded_kv_tokens == 550
    # the sdpa backend's declaration, read through the registry; none for a paged kernel
    from schedlab.calibration.measure import backend_pad_waste
    from schedlab.plugins.attention.sdpa import DECODE_PAD_WASTE

    assert backend_pad_waste("sdpa") == DECODE_PAD_WASTE
    assert backend_pad_waste("sdpa", {"decode_pad_waste": 1.0}) == 1.0
    assert backend_pad_waste("triton") is None


def test_hardware_profiles_resolve_and_round_trip(tmp_path):
    assert resolve_hardware("h100") is H100
    assert resolve_hardware("H100").name == "H100-SXM"
    p = resolve_hardware({"preset": "a100", "linear_efficiency": 0.5})
    assert p.linear_efficiency == 0.5 and p.matmul_flops == PRESETS["a100"].matmul_flops
    path = p.save(tmp_path / "prof.json")
    assert HardwareProfile.load(path) == p
    assert resolve_hardware(str(path)) == p
    assert resolve_hardware({"path": str(path), "step_overhead": 0.0}).step_overhead == 0.0
    assert json.loads(path.read_text())["name"] == "A100-80GB-SXM"
    with pytest.raises(ValueError, match="a100, h100, h200, cpu"):
        resolve_hardware("tpu")
    with pytest.raises(ValueError, match="unknown hardware fields"):
        resolve_hardware({"preset": "h100", "flops": 1})


@pytest.mark.parametrize(("override", "says"), [
    ({"step_overhead": -1}, "step_overhead=-1 must be >= 0"),
    ({"seq_overhead": -1e-6}, "seq_overhead=-1e-06 must be >= 0"),
    ({"launch_overhead": -1}, "launch_overhead=-1 must be >= 0"),
    ({"decode_pad_waste": -0.5}, "decode_pad_waste=-0.5 must be >= 0"),
    ({"host_bandwidth": 0}, "host_bandwidth=0 must be positive"),
    ({"matmul_flops": "abc"}, "matmul_flops='abc' must be a number"),
    ({"kernel_time": float("nan")}, "kernel_time=nan must be a finite number"),
    ({"mem_bandwidth": float("inf")}, "mem_bandwidth=inf must be a finite number"),
])
def test_a_hardware_field_that_would_make_times_negative_or_crash_is_named(override, says):
    """Overrides that ran with negative step times, or died dividing by zero mid-run."""
    with pytest.raises(ValueError, match=says):
        resolve_hardware({"preset": "h100", **override})


def test_tensor_parallel_without_an_interconnect_is_refused_when_built():
    hw = resolve_hardware({"preset": "h100", "interconnect_bandwidth": 0})
    assert CostModel(LLAMA8B, hw).tp == 1  # one device needs no interconnect
    with pytest.raises(ValueError, match="tp=4 all-reduces over the interconnect, and hardware "
                                         "'H100-SXM' has interconnect_bandwidth=0"):
        CostModel(LLAMA8B, hw, tp=4)


def test_local_config_dir_gives_the_same_spec(llama_dir):
    assert load_config_dir(llama_dir).spec == ModelSpec.from_pretrained(llama_dir)
    assert resolve_model(llama_dir).spec.num_layers == 2
    with pytest.raises(ValueError, match="llama3_8b"):
        resolve_model("no_such_model")


def test_nnls_matches_a_known_solution():
    rng = np.random.default_rng(0)
    a = rng.random((30, 4))
    x = np.array([0.5, 0.0, 2.0, 1.0])
    got = nnls(a, a @ x)
    assert np.allclose(got, x, atol=1e-8)
    assert (nnls(a, -a @ x) >= 0).all()


def _gpu_grid() -> list[StepShape]:
    grid = [StepShape.from_lens([n], [0]) for n in (128, 512, 2048, 8192)]
    grid += [StepShape.from_lens([n], [c]) for n, c in ((512, 7680), (256, 4096), (1024, 3072))]
    grid += [StepShape.from_lens([1] * b, [c] * b)
             for b in (1, 8, 32, 128, 256) for c in (128, 1024, 4096)]
    grid += [StepShape.from_lens([1] * 64 + [512], [1000] * 64 + [0])]
    return grid


def test_calibration_recovers_known_factors_from_noisy_synthetic_timings():
    truth = replace(H100, linear_efficiency=0.62, attention_efficiency=0.45,
                    memory_efficiency=0.83, kv_efficiency=0.71, step_overhead=2e-3,
                    seq_overhead=5e-6, prefill_overhead=3e-5)
    grid = _gpu_grid()
    model = CostModel(LLAMA8B, truth, 2)
    rng = np.random.default_rng(1)
    times = [model.step_time(s, BS) * (1 + 0.02 * rng.standard_normal()) for s in grid]
    fit = fit_profile(LLAMA8B, H100, grid, times, block_size=BS, dtype_bytes=2)
    got = fit.profile
    for key in ("linear_efficiency", "attention_efficiency", "kv_efficiency"):
        assert getattr(got, key) == pytest.approx(getattr(truth, key), rel=0.1), key
    # a decode reads the same weights every step, as constant as the fixed overhead: the fit
    # may trade one for the other, but not their sum
    weights = CostModel(LLAMA8B, got, 2).weight_bytes / got.mem_bandwidth
    assert weights / got.memory_efficiency + got.step_overhead == pytest.approx(
        weights / truth.memory_efficiency + truth.step_overhead, rel=0.05)
    assert fit.mean_abs_error < 0.03
    # a fit without every 4th shape predicts those within a few percent
    held = fit_profile(LLAMA8B, H100, grid, times, block_size=BS, dtype_bytes=2, hold_out=4)
    assert len(held.held_out) == -(-len(grid) // 4) and held.held_out_error < 0.05


def test_small_m_gemms_fall_below_the_roofline_and_whole_tiles_are_computed():
    hw = PRESETS["a100"]
    k, n = 4096, 14336
    roof = [max(2 * m * k * n / (hw.matmul_flops * hw.linear_efficiency),
                (k * n + m * (k + n)) * 2 / (hw.mem_bandwidth * hw.memory_efficiency))
            for m in (1, 128, 4096)]
    got = [op.gemm_time(hw, m, k, n, 2) - hw.kernel_time for m in (1, 128, 4096)]
    assert got[0] == pytest.approx(roof[0], rel=0.01)  # memory-bound: the weights' read
    assert got[1] > 1.3 * roof[1]  # near the ridge, neither bound is reached
    assert got[2] == pytest.approx(roof[2], rel=0.02)  # compute-bound
    # one row past a tile boundary costs a whole tile more
    assert op.gemm_time(hw, 4097, k, n, 2) > op.gemm_time(hw, 4096, k, n, 2) * 1.01


def test_an_eager_step_on_a_small_model_is_launch_bound_and_graphs_remove_it():
    tiny = ModelSpec(architecture="LlamaForCausalLM", num_layers=22, hidden_size=2048,
                     num_heads=32, num_kv_heads=4, head_dim=64, intermediate_size=5632,
                     vocab_size=32000, max_position_embeddings=2048)
    cm = CostModel(tiny, PRESETS["h200"], 2)
    decode = StepShape.from_lens([1] * 4, [100] * 4)
    eager, graphs = cm.step_cost(decode, BS), cm.step_cost(decode, BS, graphs=True)
    assert eager.launch > 0 and eager.launch + eager.device == pytest.approx(
        cm.kernels_per_step * PRESETS["h200"].launch_overhead)
    assert graphs.launch == 0.0 and graphs.total < eager.total


def _operator_rows(truth: HardwareProfile, spec: ModelSpec, noise: float = 0.0):
    from schedlab.calibration.profile_csv import OperatorTime, predict

    model = CostModel(spec, truth, 2)
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    gemms = ((h, d * (spec.num_heads + 2 * spec.num_kv_heads)), (d * spec.num_heads, h),
             (h, 2 * inter), (inter, h))
    rows = [OperatorTime("gemm", m, 1.0, k=k, n=n) for m in (1, 16, 64, 256, 1024, 4096)
            for k, n in gemms]
    rows += [OperatorTime("lm_head", m, 1.0) for m in (1, 8, 64)]
    rows += [OperatorTime("attention_prefill", q, 1.0, context_len=c)
             for q, c in ((256, 0), (512, 0), (1024, 0), (2048, 0), (512, 1024), (128, 3072))]
    rows += [OperatorTime("attention_decode", 1, 1.0, num_seqs=b, context_len=c)
             for b, c in ((1, 512), (8, 1024), (32, 2048), (128, 512), (64, 4096))]
    rows += [OperatorTime(o, m, 1.0) for o in ("kv_write", "elementwise")
             for m in (1, 16, 128, 512, 2048)]
    rows += [OperatorTime("sampling", m, 1.0) for m in (1, 8, 64)]
    rng = np.random.default_rng(0)
    return [replace(r, time_s=predict(model, r) * (1 + noise * rng.standard_normal()))
            for r in rows]


def test_operator_profiles_round_trip_and_fit_each_operator(tmp_path):
    from schedlab.calibration.profile_csv import fit_operators, read_profile, write_profile

    truth = replace(PRESETS["a100"], linear_efficiency=0.55, memory_efficiency=0.75,
                    attention_efficiency=0.4, kv_efficiency=0.6, kv_write_efficiency=0.02,
                    elementwise_efficiency=0.5, kernel_time=3e-6)
    rows = _operator_rows(truth, LLAMA8B, noise=0.01)
    path = write_profile(tmp_path / "ops.csv", rows)
    back = read_profile(path)
    assert [(r.operator, r.num_tokens, r.k) for r in back] == [
        (r.operator, r.num_tokens, r.k) for r in rows]
    fit = fit_operators(LLAMA8B, PRESETS["a100"], back, dtype_bytes=2, hold_out=4)
    for key in ("linear_efficiency", "memory_efficiency", "attention_efficiency",
                "kv_efficiency", "kv_write_efficiency", "elementwise_efficiency"):
        assert getattr(fit.profile, key) == pytest.approx(getattr(truth, key), rel=0.1), key
    assert set(fit.errors) == set(op.OPERATORS)
    assert fit.errors["gemm"].held_out and fit.errors["gemm"].held_out_error < 0.05


def test_a_bad_operator_profile_names_the_line(tmp_path):
    from schedlab.calibration.profile_csv import read_profile

    bad = tmp_path / "bad.csv"
    bad.write_text("# from my profiler\noperator,num_tokens,time_us\ngemm_fp8,4,1.0\n")
    with pytest.raises(ValueError, match=r"line 2: operator='gemm_fp8'; accepted: gemm"):
        read_profile(bad)
    bad.write_text("operator,num_tokens,time_us\ngemm,4,1.0\n")
    with pytest.raises(ValueError, match="line 2: a gemm row needs k and n"):
        read_profile(bad)
    bad.write_text("op,tokens\n")
    with pytest.raises(ValueError, match="no column operator, num_tokens, time_us"):
        read_profile(bad)
