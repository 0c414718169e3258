"""schedlab: a research framework for LLM-inference scheduling policies."""

from __future__ import annotations

from schedlab._lazy import lazy_exports
from schedlab.request import CompletionOutput, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Engine", "EngineConfig"]
__version__ = "0.1.0"


# LLM and Engine pull in torch and transformers: imported on first use only
__getattr__ = lazy_exports(__name__, {"LLM": "schedlab.llm", "Engine": "schedlab.engine",
                                      "EngineConfig": "schedlab.config"})
