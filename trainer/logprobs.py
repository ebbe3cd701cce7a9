"""Scoring token sequences under the policy: per-token log-probabilities of the policy's own tokens under the
distribution the rollouts were sampled from (`token_logprobs`, `warp_logits`), and the padded batches they take
(`pad_batch`). Used by the update, generation and the warm start alike."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


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
