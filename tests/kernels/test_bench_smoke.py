"""The GPU benchmark degrades to an interpreter smoke check on a CPU-only machine."""

from __future__ import annotations

import pytest
import torch

from schedlab.kernels import bench_attention


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full bench")
def test_bench_without_a_gpu_says_so_and_passes_its_smoke_check(capsys):
    assert bench_attention.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No CUDA device: the benchmark needs a GPU.")
    assert "FAIL" not in out and "smoke check passed" in out
