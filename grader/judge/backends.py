"""The judge's model backends: the shared classes of `inference` (one place for judge and policy).

`make_backend(kind, model, adapter=..., base_url=...)` builds a chat backend for `--backend
transformers|openai|vllm`; `chat_batch` answers many conversations in one forward batch.
"""

from __future__ import annotations

from typing import Any

from inference.base import BackendError, ChatBackend, chat_batch, make_backend
from inference.openai import OpenAIBackend

__all__ = ["BackendError", "ChatBackend", "OpenAIBackend", "chat_batch", "make_backend"]


def __getattr__(name: str) -> Any:
    # Resolved lazily: importing the judge must not import torch/transformers (or vllm) until a model is used.
    if name == "TransformersBackend":
        from inference.hf import TransformersBackend

        return TransformersBackend
    if name == "VLLMBackend":
        from inference.vllm import VLLMBackend

        return VLLMBackend
    raise AttributeError(name)
