"""In-process vLLM backend (optional extra `gagar[vllm]`): the only module that imports vllm, and lazily."""

from __future__ import annotations

import os
from typing import Any


class VLLMBackend:
    """`vllm.LLM` with an optional LoRA adapter; same `chat` interface as the other backends."""

    def __init__(self, model: str, adapter: str | None = None, **engine_kwargs: Any) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(
                "the vllm backend needs vLLM (CUDA only): install it in its own environment with "
                "`pip install 'gagar[vllm]'`, or run `vllm serve` and use --backend openai"
            ) from exc
        if adapter:
            engine_kwargs.setdefault("enable_lora", True)
        self.llm = LLM(model=model, **engine_kwargs)
        self.adapter = adapter
        self.name = os.path.basename(model.rstrip("/")) + (f"+{os.path.basename(adapter.rstrip('/'))}" if adapter else "")

    def chat(self, messages: list[dict[str, Any]], *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        from vllm import SamplingParams

        lora = None
        if self.adapter:
            from vllm.lora.request import LoRARequest

            lora = LoRARequest("judge", 1, self.adapter)
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature)
        outputs = self.llm.chat(messages, params, lora_request=lora, use_tqdm=False)
        return outputs[0].outputs[0].text
