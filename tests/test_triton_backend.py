"""attention=triton end to end: greedy parity with transformers, and a clear error without
a way to run Triton."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from schedlab.llm import LLM
from schedlab.plugins.attention.triton import TritonBackend
from schedlab.request import SamplingParams

PROMPTS = [[1, 5, 9, 22, 7], list(range(3, 30)), [100, 200, 300]]
MAX_TOKENS = 5
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _generate(model_dir: str, **kwargs) -> list[list[int]]:
    llm = LLM(model=model_dir, attention="triton", device=DEVICE, max_model_len=128,
              num_kv_blocks=64, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize(
    "options",
    [
        # two sequences at a time: later prompts prefill in the same step as earlier decodes
        dict(kv_allocator="paged", block_size=4, max_num_seqs=2),
        # the interpreter is slow: the contiguous layout runs in the slow suite
        pytest.param(dict(kv_allocator="contiguous", block_size=8, max_num_seqs=2),
                     marks=pytest.mark.slow),
    ],
    ids=["paged", "contiguous"],
)
def test_greedy_output_equals_transformers(llama_dir, hf_reference, options):
    got = _generate(llama_dir, **options)
    want = [hf_reference(llama_dir, p, MAX_TOKENS) for p in PROMPTS]
    assert got == want


def test_chunked_prefill_equals_transformers(llama_dir, hf_reference):
    """Prompts cut into 8-token chunks attend over their earlier chunks in the paged cache."""
    pytest.importorskip("schedlab.plugins.schedulers.chunked_prefill")
    got = _generate(llama_dir, scheduler="chunked_prefill", max_num_batched_tokens=8,
                    block_size=4)
    assert got == [hf_reference(llama_dir, p, MAX_TOKENS) for p in PROMPTS]


def test_cpu_without_the_interpreter_is_refused_in_one_sentence(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1 before starting"):
        TritonBackend.check_available(torch.device("cpu"))


_SCRIPT = """
import sys
from schedlab.llm import LLM
try:
    LLM(model=sys.argv[1], attention="triton", device="cpu")
except Exception as e:
    print(f"{type(e).__name__}: {e}")
    sys.exit(1)
print("started")
"""


def test_engine_start_names_the_fix_without_a_driver_traceback(llama_dir):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, llama_dir], env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert proc.stdout.strip() == (
        "RuntimeError: attention=triton on device=cpu needs Triton's interpreter: "
        "set TRITON_INTERPRET=1 before starting, or run on a CUDA device"
    ), out
    assert "Traceback" not in out and "driver" not in out


_LATE_SCRIPT = """
import os
os.environ.pop("TRITON_INTERPRET", None)
import torch
import schedlab.kernels.decode_attention  # decorated for a GPU driver
os.environ["TRITON_INTERPRET"] = "1"
from schedlab.plugins.attention.triton import TritonBackend
try:
    TritonBackend.check_available(torch.device("cpu"))
except RuntimeError as e:
    print(e)
"""


def test_interpreter_switched_on_too_late_is_named():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", _LATE_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert "TRITON_INTERPRET=1 was set after the kernels were imported" in proc.stdout, (
        proc.stdout + proc.stderr)
