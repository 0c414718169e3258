"""Kernel-test fixtures (the root conftest has already set TRITON_INTERPRET=1 without CUDA)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(1234)
    return g


@pytest.fixture
def device() -> torch.device:
    """CUDA when present (compiled kernels), else the CPU (interpreted kernels)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
