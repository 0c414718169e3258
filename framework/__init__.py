"""schedlab: a research framework for LLM-inference scheduling policies."""

from __future__ import annotations

from schedlab import _moved
from schedlab.request import CompletionOutput, RequestOutput, SamplingParams

_moved.install()  # old paths of modules moved to schedlab.sim / schedlab.runs, with a warning

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Engine", "EngineConfig"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM and Engine pull in torch and transformers: import them on first use only.
    if name == "LLM":
        from schedlab.llm import LLM

        return LLM
    if name == "Engine":
        from schedlab.engine import Engine

        return Engine
    if name == "EngineConfig":
        from schedlab.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'schedlab' has no attribute {name!r}")
