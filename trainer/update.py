"""The policy update: a clipped token-level policy gradient (asymmetric DAPO clip, optional k3 KL), with
truncated importance sampling against the sampling engine, the standard loss aggregations, gradient accumulation
and a learning-rate schedule.

Per token t of rollout i (advantage A_i):
    ratio  = exp(log π_θ − log π_old)                     π_old: the trainer's own scores at generation time
    pg     = max(−A·ratio, −A·clip(ratio, 1 − clip_low, 1 + clip_high))
    tis    = min(exp(log π_old − log π_sampler), tis_cap) when the engine reported its log-probs (vLLM, a
             server), else 1: the sampler's numerics differ from the trainer's (kernels, precision, a stale
             adapter), so its samples are off-policy for π_old; TIS reweights them, truncated (verl's TIS)
    loss_t = tis·pg + kl_coef·k3(π_ref ‖ π_θ)
then aggregated over the optimizer step's rollouts by `loss_agg` (verl's names):
    token_mean                Σ loss_t / Σ tokens (DAPO; the default)
    seq_mean_token_mean       mean over rollouts of each rollout's token mean (GRPO's original)
    seq_mean_token_sum        mean over rollouts of each rollout's token sum
    seq_mean_token_sum_norm   Σ loss_t / (rollouts · L): Dr. GRPO's constant normaliser, L = `loss_scale`
                              (default: the policy-token budget of a rollout), so no rollout's tokens count for
                              more because it is short
The normaliser is taken over all `grad_accum` micro-batches of an optimizer step, so accumulating k micro-batches
of m rollouts is the same update as one batch of k·m.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from trainer.agent import Trajectory
from trainer.config import OptimConfig
from trainer.logprobs import pad_batch, token_logprobs
from trainer.policy import reference_context


def lr_factor(step: int, o: OptimConfig, total_steps: int) -> float:
    """The learning-rate multiplier at RL step `step` (1-based): transformers' schedules (linear warm-up over
    `warmup_steps`, then constant, or cosine down to `min_lr_ratio` at `total_steps`), read as a pure function of
    the step so a resumed run continues on the same curve."""
    from transformers import get_scheduler

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    if o.lr_schedule == "constant":
        sched = get_scheduler("constant_with_warmup", probe, num_warmup_steps=o.warmup_steps)
    else:
        sched = get_scheduler("cosine_with_min_lr", probe, num_warmup_steps=o.warmup_steps,
                              num_training_steps=max(total_steps, o.warmup_steps + 1),  # ends at step total
                              scheduler_specific_kwargs={"min_lr_rate": o.min_lr_ratio})
    return float(sched.lr_lambdas[0](step))  # step 1 already learns (warm-up 1/w, 2/w, ..., 1)


def _aggregate(tok_loss: torch.Tensor, mask: torch.Tensor, o: OptimConfig, n_tokens: float, n_seqs: float,
               loss_scale: float) -> torch.Tensor:
    """One micro-batch's share of the optimizer step's loss; `n_tokens` / `n_seqs`: the whole step's counts."""
    per_tok = tok_loss * mask
    if o.loss_agg == "token_mean":
        return per_tok.sum() / n_tokens
    if o.loss_agg == "seq_mean_token_mean":
        return (per_tok.sum(1) / mask.sum(1).clamp(min=1)).sum() / n_seqs
    if o.loss_agg == "seq_mean_token_sum":
        return per_tok.sum() / n_seqs
    return per_tok.sum() / (n_seqs * loss_scale)  # seq_mean_token_sum_norm (Dr. GRPO)


def policy_update(model: Any, optimizer: torch.optim.Optimizer, items: list[tuple[Trajectory, float]],
                  o: OptimConfig, *, pad_id: int, temperature: float, top_p: float, seed: int,
                  ref_model: Any = None, loss_scale: float | None = None, lr: float | None = None) -> dict[str, float]:
    """`o.epochs` passes over (trajectory, advantage) pairs; an optimizer step per `o.minibatch_size ×
    o.grad_accum` rollouts (micro-batches of `minibatch_size`); returns the mean statistics. New log-probs are
    scored under the sampling distribution (temperature, top-p), like the behaviour ones. `lr`: this step's
    learning rate (the schedule's, `lr_factor`); `loss_scale`: Dr. GRPO's constant (seq_mean_token_sum_norm)."""
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    if o.kl_coef == 0:
        items = [(t, a) for t, a in items if a != 0.0]  # zero advantage, zero gradient: skip the compute
    if not items:
        return {}
    scale = float(loss_scale or o.loss_scale or 1)
    stats: dict[str, list[float]] = {k: [] for k in ("loss", "clip_frac", "kl", "entropy", "grad_norm", "tis_mean",
                                                    "tis_capped")}
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    rng = random.Random(seed + len(items))
    step_size = o.minibatch_size * o.grad_accum
    for _ in range(o.epochs):
        rng.shuffle(items)
        for i in range(0, len(items), step_size):
            step_items = items[i : i + step_size]
            n_tokens = float(sum(sum(t.mask[1:]) for t, _ in step_items)) or 1.0
            optimizer.zero_grad()
            loss_total = 0.0
            for j in range(0, len(step_items), o.minibatch_size):
                part = _micro_batch(model, step_items[j : j + o.minibatch_size], o, pad_id, device, temperature,
                                    top_p, ref_model, n_tokens, float(len(step_items)), scale, stats)
                loss_total += part
            gn = torch.nn.utils.clip_grad_norm_(params, o.max_grad_norm)
            optimizer.step()
            stats["loss"].append(loss_total)
            stats["grad_norm"].append(float(gn))
    return {k: sum(v) / len(v) for k, v in stats.items() if v}


def _micro_batch(model: Any, mb: list[tuple[Trajectory, float]], o: OptimConfig, pad_id: int, device: Any,
                 temperature: float, top_p: float, ref_model: Any, n_tokens: float, n_seqs: float, scale: float,
                 stats: dict[str, list[float]]) -> float:
    """Forward and backward of one micro-batch (gradients accumulate); returns its share of the loss."""
    ids, attn, lmask = pad_batch([t.token_ids for t, _ in mb], [t.mask for t, _ in mb], pad_id, device)
    mask = lmask[:, 1:]  # position t scores token t+1
    old = torch.zeros_like(mask)
    behaviour = torch.zeros_like(mask)
    has_sampler = torch.zeros(len(mb), 1, dtype=torch.bool, device=device)
    for r, (t, _) in enumerate(mb):
        old[r, : len(t.old_logprobs)] = torch.tensor(t.old_logprobs)
        if t.sampler_logprobs is not None and o.tis_cap is not None:
            behaviour[r, : len(t.sampler_logprobs)] = torch.tensor(t.sampler_logprobs)
            has_sampler[r] = True
    adv = torch.tensor([a for _, a in mb], device=device)[:, None]
    logp, ent = token_logprobs(model, ids, attn, lmask, with_entropy=True, temperature=temperature, top_p=top_p)
    ratio = torch.exp(logp - old)
    # PPO/DAPO clipped surrogate: pessimistic of the raw and the clipped ratio; clip-higher lets low-probability
    # tokens with positive advantage grow more than a symmetric clip would.
    tok_loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - o.clip_low, 1 + o.clip_high))
    if o.tis_cap is not None:
        raw = torch.exp((old - behaviour).clamp(max=math.log(1e6)))
        tis = torch.where(has_sampler, raw.clamp(max=o.tis_cap), torch.ones_like(raw))
        tok_loss = tok_loss * tis  # a constant weight per token: no gradient flows through it
        sel = (mask > 0) & has_sampler
        if bool(sel.any()):
            stats["tis_mean"].append(float(tis[sel].mean()))
            stats["tis_capped"].append(float((raw[sel] > o.tis_cap).float().mean()))
    kl = torch.zeros_like(tok_loss)
    if o.kl_coef > 0:
        with torch.no_grad(), reference_context(model, ref_model) as ref:
            ref_logp, _ = token_logprobs(ref, ids, attn, lmask, temperature=temperature, top_p=top_p)
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1  # k3 estimator: unbiased, always >= 0
        tok_loss = tok_loss + o.kl_coef * kl
    loss = _aggregate(tok_loss, mask, o, n_tokens, n_seqs, scale)
    loss.backward()
    n = mask.sum().clamp(min=1)
    was_clipped = ((ratio > 1 + o.clip_high) & (adv > 0)) | ((ratio < 1 - o.clip_low) & (adv < 0))
    stats["clip_frac"].append(float((was_clipped.float() * mask).sum() / n))
    stats["kl"].append(float((kl.detach() * mask).sum() / n))
    stats["entropy"].append(float((ent.detach() * mask).sum() / n))
    return float(loss.detach())
