"""Capture safety on the CPU: the captured decode forward of every backend that declares
`supports_cuda_graphs` (transformers' own layers included) runs no op a CUDA graph cannot
hold (`capture_safety.CaptureSafetyRecorder`)."""

from __future__ import annotations

import pytest
import torch
from capture_safety import CaptureSafetyRecorder

from schedlab import LLM, SamplingParams, registry
from schedlab.attention import PAD_SLOT_ID, AttentionMetadata
from schedlab.plugins.attention.sdpa import SDPABackend
from schedlab.shapes import KVCacheSpec


def _record(fn) -> CaptureSafetyRecorder:
    rec = CaptureSafetyRecorder("cpu")
    with rec:
        fn()
    return rec


@pytest.mark.parametrize("unsafe, op", [
    (lambda x: x.sum().item(), "_local_scalar_dense"),
    (lambda x: bool(x.any()), "_local_scalar_dense|is_nonzero"),  # is_nonzero in inference
    (lambda x: int(x.max()), "_local_scalar_dense"),
    (lambda x: x.nonzero(), "nonzero"),
    (lambda x: x[x > 0], "index.Tensor"),
    (lambda x: x.index_put_((x > 0,), torch.tensor(0.0)), "index_put"),
    (lambda x: torch.masked_select(x, x > 0), "masked_select"),
    (lambda x: torch.unique(x), "unique"),
    (lambda x: torch.arange(3).repeat_interleave(torch.tensor([1, 2, 3])), "repeat_interleave"),
    (lambda x: x + torch.tensor([1.0, 2.0, 3.0, 4.0]), "lift_fresh"),
    (lambda x: torch.equal(x, x), "equal"),
], ids=["item", "bool", "int", "nonzero", "mask-index", "mask-put", "masked_select", "unique",
        "repeat_interleave", "torch.tensor", "equal"])
def test_the_recorder_flags_what_a_graph_cannot_hold(unsafe, op):
    x = torch.randn(4)
    rec = _record(lambda: unsafe(x))
    assert any(o in f.op for f in rec.findings for o in op.split("|")), rec.report()
    assert all(f.where.startswith(__file__) for f in rec.findings), rec.report()


def test_the_recorder_passes_sync_free_ops():
    x, idx, reps = torch.randn(4, 3), torch.tensor([2, 0]), torch.tensor([1, 2, 3])
    rec = _record(lambda: (
        x.masked_fill(x > 0, 0.0), torch.where(x > 0, x, -x), x.index_select(0, idx),
        torch.arange(3).repeat_interleave(reps, output_size=6),
        x.index_copy(0, idx, x[:2]), x[idx], torch.zeros(2, 3).masked_fill_(x[:2] < 0, 1.0)))
    assert rec.num_ops > 5 and not rec.findings, rec.report()


def test_the_eager_sdpa_path_with_fillers_is_caught():
    """What the graph path ran before it used the captured metadata: sdpa's grouped path
    over a padded step with real host copies checks for padding slots with a sync and a
    nonzero. The recorder must see both (so a test relying on it can fail)."""
    spec = KVCacheSpec(num_layers=1, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                       block_size=4)
    backend = SDPABackend(spec, 8, "cpu")
    lens = [6, 3, 1, 1]  # two real decodes, two fillers
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([5, 10, PAD_SLOT_ID, PAD_SLOT_ID]),
        query_start_loc=torch.arange(5, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([[0, 1], [2, 0], [0, 0], [0, 0]], dtype=torch.int32),
        query_lens=[1] * 4, seq_lens_host=lens, num_decodes=4, max_query_len=1, max_seq_len=6)
    q, kv = torch.randn(4, 4, 16), torch.randn(4, 2, 16)
    rec = _record(lambda: backend.forward(0, q, kv, kv, meta, 0.25))
    ops = {f.op for f in rec.findings}
    assert "aten.nonzero.default" in ops, rec.report()
    assert ops & {"aten.is_nonzero.default", "aten._local_scalar_dense.default"}, rec.report()
    assert all("sdpa.py" in f.where for f in rec.findings), rec.report()


def _capturable() -> list[str]:
    return [n for n in registry.available("attention")
            if registry.load("attention", n).supports_cuda_graphs]


def _params():
    for name in _capturable():
        # triton runs in the interpreter on a CPU (~3 s): one model family
        for family in ["llama"] if name == "triton" else ["llama", "qwen2"]:
            yield pytest.param(name, family, id=f"{name}-{family}")


@pytest.mark.parametrize("attention, family", list(_params()))
def test_captured_decode_forwards_hold_no_sync(attention, family, llama_dir, qwen2_dir):
    """Requests run through the emulated graph path; every bucket forward it runs (with the
    metadata a capture records) is recorded: the backend, the model's layers and the LM head
    run no op that would sync or size an output from data."""
    cls = registry.load("attention", attention)
    try:
        cls.check_available(torch.device("cpu"))
    except RuntimeError as e:
        pytest.skip(str(e))
    _check_bucket_forwards({"llama": llama_dir, "qwen2": qwen2_dir}[family], attention, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["sdpa", "triton"])
def test_captured_decode_forwards_hold_no_sync_on_cuda(attention, llama_dir):
    """The same on a GPU, graphs not captured (enforce_eager), so every op is seen: there a
    `.tolist()` or a tensor left on the CPU shows too (a copy across devices)."""
    _check_bucket_forwards(llama_dir, attention, "cuda", enforce_eager=True)


def _check_bucket_forwards(model_dir: str, attention: str, device: str, **kw) -> None:
    llm = LLM(model_dir, attention=attention, device=device, block_size=4, max_model_len=64,
              num_kv_blocks=64, cuda_graph_sizes=[2, 4],
              executor_options={"emulate_cuda_graphs": True}, **kw)
    runner = llm.engine.executor.graph_runner
    assert runner is not None and not runner.capture
    real_forward = runner._forward
    recorders: list[CaptureSafetyRecorder] = []

    def recorded(size: int, context: int) -> torch.Tensor:
        rec = CaptureSafetyRecorder(runner.device)
        recorders.append(rec)
        with rec:
            return real_forward(size, context)

    runner._forward = recorded
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert all(len(o.outputs[0].token_ids) == 3 for o in outs)
    assert recorders and all(r.num_ops > 50 for r in recorders)
    report = "\n".join(r.report() for r in recorders if r.findings)
    assert not report, f"ops a CUDA graph cannot hold in attention={attention}:\n{report}"
