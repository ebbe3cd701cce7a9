"""The one backend factory: `make_backend(kind, model, ...)` for `--backend transformers|openai|vllm|vllm-server`
(judge and policy), and `close_backend` to hand back what one holds. Apart from `inference.base` so that the
backends, which import the protocols, are not imported back by the module that defines them."""

from __future__ import annotations

from typing import Any


def make_backend(
    kind: str,
    model: Any,
    *,
    adapter: str | None = None,
    base_url: str | None = None,
    tokenizer: Any = None,
    work_dir: str | None = None,
    models_root: str | None = None,
    **engine: Any,
) -> Any:
    """Build a backend; raises ValueError with an actionable message.

    `model` is a path, a hub id or a registry model name (the judge), or an already loaded model with its `tokenizer` (the policy's
    transformers backend samples from the training model itself). `openai` here is the chat client; the
    policy's token-id completions client is `trainer.rollout.openai_server` (it hot-loads LoRA adapters).
    `vllm-server` starts a `vllm serve` of `model` (logs under `work_dir`) and chats with it; `close_backend`
    stops it (so does the process's exit).
    """
    if kind in ("transformers", "vllm", "vllm-server") and isinstance(model, str) and model:
        from inference.models import resolve_model

        # a registry name (`gagar model pull`) → its local directory, in `models_root` (the trainer's
        # model.cache_dir) or the per-user cache
        model = resolve_model(model, models_root)
    if kind == "transformers":
        if model is None or model == "":
            raise ValueError("--backend transformers needs --model PATH_OR_ID")
        from inference.hf import TransformersBackend

        return TransformersBackend(model, adapter, tokenizer=tokenizer, **engine)
    if kind == "openai":
        if not base_url or not model:
            raise ValueError("--backend openai needs --base-url URL and --model NAME (the server's model name)")
        if adapter:
            raise ValueError("--adapter is not used with --backend openai: serve the adapter (vllm --lora-modules)")
        from inference.openai import OpenAIBackend

        return OpenAIBackend(base_url, str(model), **engine)
    if kind == "vllm":
        if not model:
            raise ValueError("--backend vllm needs --model PATH_OR_ID")
        from inference.vllm import VLLMBackend

        return VLLMBackend(str(model), adapter, tokenizer=tokenizer, work_dir=work_dir, **engine)
    if kind == "vllm-server":
        if not model:
            raise ValueError("--backend vllm-server needs --model PATH_OR_ID")
        from inference.vllm_server import served_chat

        return served_chat(str(model), adapter, log_dir=work_dir or ".gagar/logs", **engine)
    raise ValueError(f"unknown backend {kind!r}; choose transformers, openai, vllm or vllm-server")


def close_backend(backend: Any) -> None:
    """Hand back what a backend holds (an engine, a server process); a backend without any has no `close`."""
    close = getattr(backend, "close", None)
    if callable(close):
        close()
