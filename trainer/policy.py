"""The policy: load a causal LM (hub id, local path, or the tiny demo model), wrap it in PEFT LoRA or train it
whole (`build_policy`), warm-started first when configured; scoring its tokens is `trainer.logprobs`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.config import ModelConfig, TrainConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def base_model_path(cfg: ModelConfig, log: Any = print) -> str:
    """A registry name (`smollm2-135m-instruct`) is pulled once into `cache_dir/base/NAME` (`gagar model pull`;
    cache_dir null: the per-user models cache);
    `tiny` builds (once, cached) the random tiny Qwen2 from sft.tiny — plumbing tests only; a local path or a
    hub id is passed through."""
    if cfg.name_or_path != "tiny":
        from inference.models import resolve_model

        return resolve_model(cfg.name_or_path, cfg.cache_dir, log=log)
    from inference.models import models_root
    from sft.tiny import build_tiny_model

    out = models_root(cfg.cache_dir) / f"tiny-h{cfg.tiny_hidden_size}-l{cfg.tiny_num_layers}-s{cfg.seed}"
    return str(build_tiny_model(out, seed=cfg.seed, hidden_size=cfg.tiny_hidden_size, num_layers=cfg.tiny_num_layers))


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.chat_template is None:
        raise ValueError(f"{path}: the tokenizer has no chat template; use an instruct/chat model")
    return tok


def load_policy(cfg: TrainConfig, path: str, adapter: str | None = None) -> Any:
    """The trainable model on its device: PEFT LoRA over `path` (optionally loading an adapter) or full weights."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(cfg.model.device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[cfg.model.dtype]).to(device)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if not cfg.lora.enabled:
        return model
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter:
        return PeftModel.from_pretrained(model, adapter, is_trainable=True)
    lcfg = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lcfg)


def reference_context(model: Any, ref_model: Any | None):
    """A context in which `model` (or `ref_model`) computes the reference policy: LoRA off, or the frozen copy."""
    if ref_model is not None:
        return contextlib.nullcontext(ref_model)
    if hasattr(model, "disable_adapter"):
        cm = model.disable_adapter()

        class _Ctx:
            def __enter__(self):
                cm.__enter__()
                return model

            def __exit__(self, *a):
                return cm.__exit__(*a)

        return _Ctx()
    raise ValueError("KL to the reference needs LoRA or a reference model")


@dataclass
class Policy:
    """Everything the update touches: tokenizer, trainable model, optimiser, optional frozen reference."""

    tokenizer: Any
    model: Any
    optimizer: torch.optim.Optimizer
    base_path: str  # the (warm-started) base weights under the LoRA adapter
    ref_model: Any = None

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id


def build_policy(cfg: TrainConfig, instances: dict, *, ckpt: Path | None = None, state: dict | None = None,
                 log: Any = print) -> Policy:
    """The policy to train: from a checkpoint (its base model, adapter or weights, optimiser state), or the
    configured model — warm-started on the tasks' rollout patches first when `warmstart.enabled`."""
    state = state or {}
    path = state.get("base_model") or base_model_path(cfg.model, log)
    tokenizer = load_tokenizer(path)
    if cfg.warmstart.enabled and not ckpt:
        from trainer.warmstart import ensure_warmstart

        path = ensure_warmstart(cfg, path, instances, tokenizer, log=log)
    weights = str(ckpt / "weights") if ckpt else None
    model = load_policy(cfg, path if cfg.lora.enabled or not weights else weights,
                        weights if cfg.lora.enabled else None)
    ref = None
    if cfg.optim.kl_coef > 0 and not cfg.lora.enabled:
        ref = load_policy(cfg, path).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    if ckpt:
        from trainer.checkpoint import restore_optimizer

        restore_optimizer(ckpt, optimizer)
    return Policy(tokenizer, model, optimizer, path, ref)
