"""The policy's rollout backend, chosen by `rollout.backend` (the classes live in `inference`, shared with the judge)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inference.base import RolloutBackend, Sample

if TYPE_CHECKING:
    from trainer.config import TrainConfig

__all__ = ["RolloutBackend", "Sample", "make_backend"]


def make_backend(cfg: TrainConfig, model: Any, tokenizer: Any, work_dir: str, *,
                 base_path: str | None = None) -> RolloutBackend:
    """Map the train config onto `inference`: transformers samples from the training model itself. `base_path`:
    the weights under the trainer's LoRA adapter (a warm-started or resumed base; default the configured model),
    which an in-process vLLM engine must load for the adapters it receives to mean anything."""
    backend = cfg.rollout.backend
    if backend == "transformers":
        from inference.hf import TransformersBackend

        return TransformersBackend(model, tokenizer=tokenizer)
    if backend == "openai":
        from trainer.rollout.openai_server import OpenAIServerBackend

        return OpenAIServerBackend(
            cfg.rollout.base_url, cfg.rollout.served_model or cfg.model.name_or_path, tokenizer, work_dir,
            lora=cfg.lora.enabled, check_logprobs=cfg.optim.tis_cap is not None,
        )
    if backend == "vllm":
        if not cfg.lora.enabled:
            raise RuntimeError("rollout.backend=vllm pushes LoRA adapters only; set lora.enabled: true")
        from inference.models import resolve_model
        from inference.vllm import VLLMBackend

        base = base_path or resolve_model(cfg.model.name_or_path, cfg.model.cache_dir)  # a registry name → its dir
        return VLLMBackend.for_policy(base, lora_rank=cfg.lora.r, dtype=cfg.model.dtype,
                                      seed=cfg.seed, tokenizer=tokenizer, work_dir=work_dir)
    raise ValueError(f"unknown rollout backend {backend!r}")
