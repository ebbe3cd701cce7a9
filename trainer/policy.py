"""The policy: load a causal LM (hub id, local path, or the tiny demo model), wrap it in PEFT LoRA or train it
whole, and score token sequences (per-token log-probabilities of the policy's own tokens)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
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


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution the rollouts were sampled from: logits / T, then the nucleus (top-p) kept, as
    transformers' and vLLM's samplers do (temperature first; the smallest set of tokens whose probability
    reaches top_p, at least one). Tokens outside the nucleus get a large negative logit (finite, so entropies
    stay finite). Scoring a sampled token with the raw distribution would make the importance ratio compare
    two different policies."""
    if temperature <= 0:
        raise ValueError(f"log-probs need a sampling temperature > 0, got {temperature}")
    logits = logits / temperature if temperature != 1.0 else logits
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    # Drop a token when the tokens strictly more likely than it already reach top_p (keeps at least the first).
    drop_sorted = (probs.cumsum(-1) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, _OUTSIDE)


_OUTSIDE = -1e4  # logit of a token outside the nucleus: probability 0 in float32, log-prob still finite
# A token the *current* policy puts outside its nucleus has log-prob ≈ -1e4; clamp it so the ratio is ~0 and the
# KL estimator's exp(ref − logp) cannot overflow.
_MIN_LOGP = -30.0


def token_logprobs(model: Any, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, *,
                   with_entropy: bool = False, temperature: float = 1.0, top_p: float = 1.0):
    """log π(token_{t+1} | tokens_≤t) where `mask` (B, T) marks the scored tokens, as a (B, T-1) tensor aligned
    with `ids[:, 1:]` (0 elsewhere); optionally the entropy at those positions. π is the sampling distribution
    (`temperature`, `top_p`; see `warp_logits`). Only the masked positions go through the LM head: with a large
    vocabulary and long prompts that head is most of the compute."""
    core = _core(model)
    hidden = core.model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state[:, :-1]
    sel = mask[:, 1:].bool()
    logits = warp_logits(core.lm_head(hidden[sel]).float(), temperature, top_p)
    logp_all = F.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, ids[:, 1:][sel][:, None]).squeeze(-1)
    if top_p < 1.0:
        picked = picked.clamp(min=_MIN_LOGP)
    logp = torch.zeros(sel.shape, dtype=picked.dtype, device=picked.device).masked_scatter(sel, picked)
    if not with_entropy:
        return logp, None
    ent_sel = -(logp_all.exp() * logp_all).sum(-1)
    ent = torch.zeros(sel.shape, dtype=ent_sel.dtype, device=ent_sel.device).masked_scatter(sel, ent_sel)
    return logp, ent


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
