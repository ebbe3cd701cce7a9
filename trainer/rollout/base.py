"""The backend protocol and the factory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainer.config import TrainConfig


@dataclass
class Sample:
    token_ids: list[int]  # the completion only, as sampled (eos included when the model emitted it)
    text: str
    finish_reason: str  # "stop" (eos or a stop string) | "length"


class RolloutBackend(Protocol):
    name: str

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        stop: list[str] | None = None,
    ) -> list[Sample]:
        """One completion per prompt (callers repeat a prompt n times for a group)."""
        ...

    def sync_weights(self, model: Any, step: int) -> None:
        """Make the engine sample from `model`'s current weights (no-op when it shares them)."""
        ...


def make_backend(cfg: TrainConfig, model: Any, tokenizer: Any, work_dir: str) -> RolloutBackend:
    backend = cfg.rollout.backend
    if backend == "transformers":
        from trainer.rollout.hf import TransformersBackend

        return TransformersBackend(model, tokenizer)
    if backend == "openai":
        from trainer.rollout.openai_server import OpenAIServerBackend

        return OpenAIServerBackend(
            cfg.rollout.base_url, cfg.rollout.served_model or cfg.model.name_or_path, tokenizer, work_dir,
            lora=cfg.lora.enabled,
        )
    if backend == "vllm":
        from trainer.rollout.vllm_engine import VLLMBackend

        return VLLMBackend(cfg, tokenizer, work_dir)
    raise ValueError(f"unknown rollout backend {backend!r}")
