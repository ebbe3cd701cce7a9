"""GAGAR: quality-aware, sum-preserving redistribution of the passing rollouts' positive advantages.

Per group, over P = {passing rollouts with A_i > 0} and weights f_i ∈ (0, 1] from the grader:
    A'_i = λ·f̂_i·A_i for i ∈ P, A'_i = A_i otherwise,  f̂_i = f_i / max_P f,  λ = min(cap, Σ_P A / Σ_P f̂·A).
Normalising f by the group's best weight makes λ·f̂ invariant to the weights' scale and λ ≥ 1, so equal weights
give exactly the identity, and ``cap`` bounds how much the best passing rollout can be boosted (λ ≤ 1/min f̂
anyway). Unless the cap binds, Σ_P A' = Σ_P A.
Guarantee: a passing rollout in P never ends at or below a failing rollout of its group, nor at or below 0:
λ·f̂·A > 0 already, and where float underflow or a failing rollout's own positive advantage (non-binary rewards)
would break that, A'_i is raised to just above max(0, max failing advantage) — the only other case where the sum
is not preserved exactly.
A group without a usable grading (a NaN weight on a rollout of P, or ``usable`` False) is left unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from grader.records import TIER_WEIGHTS

from .core import check_finite, compute_advantages, layout, out_dtype, work_dtype
from .segment import IndexLike

DEFAULT_TIERS: dict[int, float] = dict(TIER_WEIGHTS)  # the grader's mapping, one definition
DEFAULT_CAP = 3.0


def _redistribute(
    advantages: Tensor,
    passed: Tensor,
    weights: Tensor,
    index: IndexLike | None,
    usable: Tensor | None,
    cap: float | None,
    preserve_sum: bool,
) -> Tensor:
    if advantages.shape != passed.shape or advantages.shape != weights.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, passed {tuple(passed.shape)} and weights "
            f"{tuple(weights.shape)} must have the same shape"
        )
    if cap is not None and not cap >= 1.0:
        raise ValueError(f"cap must be >= 1 (λ >= 1 by construction), got {cap}")
    check_finite(advantages, "advantages")
    wd = work_dtype(advantages)
    seg, a = layout(advantages.to(wd), index)
    p = passed.to(torch.bool) if seg is None else seg.to_dense(passed.to(torch.bool), fill=False)
    w = weights.to(wd) if seg is None else seg.to_dense(weights.to(wd), fill=1.0)
    real = None if seg is None else torch.arange(seg.width, device=a.device) < seg.sizes[:, None]

    bad = p & torch.isfinite(w) & ((w <= 0) | (w > 1))
    if bool(bad.any()):
        raise ValueError("quality weights of passing rollouts must lie in (0, 1] (NaN marks 'not graded')")
    zero = torch.zeros((), dtype=wd, device=a.device)
    pos = p & (a > 0)
    ok = ~(pos & ~torch.isfinite(w)).any(1, keepdim=True)  # (G, 1): every rollout of P has a weight
    if usable is not None:
        ok = ok & usable.to(device=a.device, dtype=torch.bool).reshape(-1, 1)
    w = torch.where(pos, w, zero)  # NaNs outside P (or in unusable groups) must not reach the sums
    if preserve_sum:
        w = torch.nan_to_num(w, nan=0.0)
        w = w / w.amax(1, keepdim=True).clamp(min=torch.finfo(wd).tiny)
        total = torch.where(pos, a, zero).sum(1, keepdim=True)
        weighted = (w * a).sum(1, keepdim=True)
        lam = total / weighted.clamp(min=torch.finfo(wd).tiny)
        if cap is not None:
            lam = lam.clamp(max=cap)
        new = lam * w * a
    else:
        new = torch.nan_to_num(w, nan=0.0) * a
    failing = ~p if real is None else (~p & real)
    fail_max = torch.where(failing, a, torch.full((), -math.inf, dtype=wd, device=a.device)).amax(1, keepdim=True)
    floor = torch.nextafter(fail_max.clamp(min=0), torch.full((), math.inf, dtype=wd, device=a.device))
    new = torch.maximum(new, floor)
    out = torch.where(pos & ok, new, a)
    if seg is not None:
        out = seg.to_flat(out)
    return out.to(out_dtype(advantages))


def redistribute(
    advantages: Tensor,
    passed: Tensor,
    weights: Tensor,
    *,
    index: IndexLike | None = None,
    cap: float | None = DEFAULT_CAP,
    usable: Tensor | None = None,
) -> Tensor:
    """GAGAR redistribution (see the module docstring for the formula and guarantees).

    advantages, passed (bool), weights (f ∈ (0, 1], NaN = not graded): all (B, n), or all (N,) with ``index``.
    usable: optional (G,) bool — False leaves that group unchanged (G = B, or groups in sorted-label order).
    cap: upper bound on λ (default 3.0; None = uncapped). Returns advantages' shape, device and dtype.
    """
    return _redistribute(advantages, passed, weights, index, usable, cap, preserve_sum=True)


def needs_grading(
    advantages: Tensor, passed: Tensor, index: IndexLike | None = None, *, per_rollout: bool = False
) -> Tensor:
    """Bool mask of groups worth a judge call: those where some passing rollout has a positive base advantage.

    ``redistribute`` only moves the advantages of passing rollouts with A > 0, so in any other group a grading
    cannot change a single advantage (e.g. binary rewards under GAPO once half the group passes: Q = 1, every
    passing A = 0). advantages, passed: (B, n) -> (B,); or (N,) with ``index`` -> (G,), groups in sorted-label
    order (as ``mixed_outcome``). ``per_rollout=True`` broadcasts the mask back to the rollouts' shape.
    Pass the advantages *after* hack verdicts that are already known (they make passing rollouts fail).
    """
    if advantages.shape != passed.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} and passed {tuple(passed.shape)} differ in shape")
    candidate = passed.to(device=advantages.device, dtype=torch.bool) & (advantages > 0)
    seg, c = layout(candidate, index)
    keep = c.any(1)  # padding cells of a ragged layout are False
    if not per_rollout:
        return keep
    return keep[:, None].expand_as(c).clone() if seg is None else keep[seg.group]


def downweight(
    advantages: Tensor,
    passed: Tensor,
    weights: Tensor,
    *,
    index: IndexLike | None = None,
    usable: Tensor | None = None,
) -> Tensor:
    """Ablation: A'_i = f_i·A_i for passing rollouts with A_i > 0, no λ — the total positive signal shrinks."""
    return _redistribute(advantages, passed, weights, index, usable, None, preserve_sum=False)


def apply_hack_verdicts(
    rewards: Tensor, passed: Tensor, hacked: Tensor, *, failure_reward: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Confirmed hacks become failures before advantages are computed: reward -> failure_reward, passed -> False.

    All three tensors share one shape; returns new (rewards, passed) tensors.
    """
    if not rewards.shape == passed.shape == hacked.shape:
        raise ValueError("rewards, passed and hacked must have the same shape")
    hacked = hacked.to(device=rewards.device, dtype=torch.bool)
    rewards = torch.where(hacked, torch.full_like(rewards, failure_reward), rewards)
    return rewards, passed.to(torch.bool) & ~hacked


def weights_from_tiers(
    tiers: Mapping | Sequence | Tensor, values: Mapping[int, float] = DEFAULT_TIERS
) -> dict | Tensor:
    """Tiers (1 = best) -> quality weights: a mapping {rollout_id: tier} gives {rollout_id: f}; a sequence or
    tensor of tiers gives a float32 tensor. A tier of None/0 (not graded) gives NaN; an unknown tier raises."""
    for f in values.values():
        if not 0.0 < f <= 1.0:
            raise ValueError(f"tier weights must lie in (0, 1], got {dict(values)}")

    def one(t) -> float:
        if t is None or int(t) == 0:
            return math.nan
        if int(t) not in values:
            raise ValueError(f"unknown tier {t!r}; known tiers: {sorted(values)}")
        return float(values[int(t)])

    if isinstance(tiers, Mapping):
        return {rid: one(t) for rid, t in tiers.items()}
    seq = tiers.tolist() if isinstance(tiers, Tensor) else list(tiers)
    device = tiers.device if isinstance(tiers, Tensor) else None
    return torch.tensor([one(t) for t in seq], dtype=torch.float32, device=device)


def weights_from_ranking(ranking: Sequence, *, highest: float = 1.0, lowest: float = 0.2) -> dict:
    """Rank-linear weights: the best of m gets ``highest``, the worst ``lowest``, evenly spaced between;
    a single candidate gets ``highest``. ranking: rollout ids, best first."""
    if not 0.0 < lowest <= highest <= 1.0:
        raise ValueError(f"need 0 < lowest <= highest <= 1, got lowest={lowest}, highest={highest}")
    m = len(ranking)
    if len(set(ranking)) != m:
        raise ValueError("ranking lists a rollout id twice")
    step = (highest - lowest) / (m - 1) if m > 1 else 0.0
    return {rid: highest - r * step for r, rid in enumerate(ranking)}


def weights_for(rollout_ids: Sequence, weights: Mapping, *, device=None) -> Tensor:
    """Look up each rollout's weight: (N,) float32, NaN where the grading has none (failing or ungraded)."""
    return torch.tensor([float(weights.get(r, math.nan)) for r in rollout_ids], dtype=torch.float32, device=device)


def gagar_advantages(
    rewards: Tensor,
    passed: Tensor,
    weights: Tensor,
    *,
    index: IndexLike | None = None,
    hacked: Tensor | None = None,
    estimator: str = "gapo",
    cap: float | None = DEFAULT_CAP,
    usable: Tensor | None = None,
    failure_reward: float = 0.0,
    **params,
) -> Tensor:
    """The whole GAGAR step: hacks -> failures, baseline advantages (GAPO by default), redistribution."""
    if hacked is not None:
        rewards, passed = apply_hack_verdicts(rewards, passed, hacked, failure_reward=failure_reward)
    adv = compute_advantages(rewards, estimator=estimator, index=index, **params)
    return redistribute(adv, passed, weights, index=index, cap=cap, usable=usable)
