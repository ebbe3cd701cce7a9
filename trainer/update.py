"""The policy update: a clipped token-level policy gradient (asymmetric DAPO clip, optional k3 KL)."""

from __future__ import annotations

import random
from typing import Any

import torch

from trainer.agent import Trajectory
from trainer.config import OptimConfig
from trainer.policy import pad_batch, reference_context, token_logprobs


def policy_update(model: Any, optimizer: torch.optim.Optimizer, items: list[tuple[Trajectory, float]],
                  o: OptimConfig, *, pad_id: int, temperature: float, top_p: float, seed: int,
                  ref_model: Any = None) -> dict[str, float]:
    """`o.epochs` passes over (trajectory, advantage) pairs in minibatches; returns the mean statistics.
    New log-probs are scored under the sampling distribution (temperature, top-p), like the behaviour ones."""
    if o.kl_coef == 0:
        items = [(t, a) for t, a in items if a != 0.0]  # zero advantage, zero gradient: skip the compute
    if not items:
        return {}
    stats: dict[str, list[float]] = {"loss": [], "clip_frac": [], "kl": [], "entropy": [], "grad_norm": []}
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    rng = random.Random(seed + len(items))
    for _ in range(o.epochs):
        rng.shuffle(items)
        for i in range(0, len(items), o.minibatch_size):
            mb = items[i : i + o.minibatch_size]
            ids, attn, lmask = pad_batch([t.token_ids for t, _ in mb], [t.mask for t, _ in mb], pad_id, device)
            mask = lmask[:, 1:]  # position t scores token t+1
            old = torch.zeros_like(mask)
            for r, (t, _) in enumerate(mb):
                old[r, : len(t.old_logprobs)] = torch.tensor(t.old_logprobs)
            adv = torch.tensor([a for _, a in mb], device=device)[:, None]
            logp, ent = token_logprobs(model, ids, attn, lmask, with_entropy=True, temperature=temperature,
                                       top_p=top_p)
            ratio = torch.exp(logp - old)
            # PPO/DAPO clipped surrogate: pessimistic of the raw and the clipped ratio; clip-higher lets
            # low-probability tokens with positive advantage grow more than a symmetric clip would.
            tok_loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - o.clip_low, 1 + o.clip_high))
            kl = torch.zeros_like(tok_loss)
            if o.kl_coef > 0:
                with torch.no_grad(), reference_context(model, ref_model) as ref:
                    ref_logp, _ = token_logprobs(ref, ids, attn, lmask, temperature=temperature, top_p=top_p)
                d = ref_logp - logp
                kl = torch.exp(d) - d - 1  # k3 estimator: unbiased, always >= 0
                tok_loss = tok_loss + o.kl_coef * kl
            if o.loss_agg == "token_mean":
                loss = (tok_loss * mask).sum() / mask.sum().clamp(min=1)
            else:
                loss = ((tok_loss * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
            optimizer.zero_grad()
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, o.max_grad_norm)
            optimizer.step()
            n = mask.sum().clamp(min=1)
            was_clipped = ((ratio > 1 + o.clip_high) & (adv > 0)) | ((ratio < 1 - o.clip_low) & (adv < 0))
            stats["loss"].append(loss.item())
            stats["clip_frac"].append(float((was_clipped.float() * mask).sum() / n))
            stats["kl"].append(float((kl.detach() * mask).sum() / n))
            stats["entropy"].append(float((ent.detach() * mask).sum() / n))
            stats["grad_norm"].append(float(gn))
    return {k: sum(v) / len(v) for k, v in stats.items() if v}
