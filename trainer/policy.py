"""The policy: load a causal LM (hub id, local path, or the tiny demo model), wrap it in PEFT LoRA or train it
whole, and score token sequences (per-token log-probabilities of the policy's own tokens)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainer.config import ModelConfig, TrainConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def base_model_path(cfg: ModelConfig) -> str:
    """`tiny` builds (once, cached) the random tiny Qwen2 from sft.tiny; anything else is passed through."""
    if cfg.name_or_path != "tiny":
        return cfg.name_or_path
    from sft.tiny import build_tiny_model

    out = Path(cfg.cache_dir) / f"tiny-h{cfg.tiny_hidden_size}-l{cfg.tiny_num_layers}-s{cfg.seed}"
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


def pad_batch(seqs: list[list[int]], masks: list[list[int]], pad_id: int, device: torch.device):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    for r, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[r, : len(s)] = torch.tensor(s)
        attn[r, : len(s)] = 1
        loss_mask[r, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids.to(device), attn.to(device), loss_mask.to(device)


def _core(model: Any) -> Any:
    """The causal LM under any PEFT wrapper (LoRA layers are injected in place, so they still run)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_logprobs(model: Any, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, *,
                   with_entropy: bool = False):
    """log π(token_{t+1} | tokens_≤t) where `mask` (B, T) marks the scored tokens, as a (B, T-1) tensor aligned
    with `ids[:, 1:]` (0 elsewhere); optionally the entropy at those positions. Only the masked positions go
    through the LM head: with a large vocabulary and long prompts that head is most of the compute."""
    core = _core(model)
    hidden = core.model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state[:, :-1]
    sel = mask[:, 1:].bool()
    logits = core.lm_head(hidden[sel]).float()
    logp_all = F.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, ids[:, 1:][sel][:, None]).squeeze(-1)
    logp = torch.zeros(sel.shape, dtype=picked.dtype, device=picked.device).masked_scatter(sel, picked)
    if not with_entropy:
        return logp, None
    ent_sel = -(logp_all.exp() * logp_all).sum(-1)
    ent = torch.zeros(sel.shape, dtype=ent_sel.dtype, device=ent_sel.device).masked_scatter(sel, ent_sel)
    return logp, ent
