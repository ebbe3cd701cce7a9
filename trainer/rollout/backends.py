"""The policy's rollout backend factory, chosen by `rollout.backend` (the classes live in `inference`, shared with the
judge; the token-id OpenAI client in `trainer.rollout.openai_server`, which this module imports only when chosen)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inference.base import RolloutBackend

if TYPE_CHECKING:
    from trainer.config import TrainConfig


def make_backend(cfg: TrainConfig, model: Any, tokenizer: Any, work_dir: str, *,
                 base_path: str | None = None) -> RolloutBackend:
    """Map the train config onto `inference`: transformers samples from the training model itself; vllm and
    vllm-server build one engine from the same `EngineSpec`, in this process or as a `vllm serve` it owns (logs
    under `work_dir`). `base_path`: the weights under the trainer's LoRA adapter (a warm-started or resumed base;
    default the configured model), which the engine must load for the adapters it receives to mean anything.
    The caller hands the backend back with `inference.base.close_backend`."""
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
    if backend in ("vllm", "vllm-server"):
        if not cfg.lora.enabled:
            raise RuntimeError(f"rollout.backend={backend} pushes LoRA adapters only; set lora.enabled: true")
        from inference.models import resolve_model
        from inference.vllm import VLLMBackend, policy_spec

        base = base_path or resolve_model(cfg.model.name_or_path, cfg.model.cache_dir)  # a registry name → its dir
        spec = policy_spec(base, lora_rank=cfg.lora.r, dtype=cfg.model.dtype, seed=cfg.seed,
                           kv_cache_gib=cfg.rollout.kv_cache_gib)
        if backend == "vllm":
            return VLLMBackend(base, tokenizer=tokenizer, work_dir=work_dir, spec=spec)
        from inference.vllm_server import VLLMServer
        from trainer.rollout.openai_server import OpenAIServerBackend

        server = VLLMServer(spec, work_dir, port=cfg.rollout.server_port).start()
        return OpenAIServerBackend(server.url, server.model, tokenizer, work_dir, lora=True, server=server)
    raise ValueError(f"unknown rollout backend {backend!r}")
