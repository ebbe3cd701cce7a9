"""GAGAR: quality-aware, sum-preserving redistribution of the passing rollouts' positive advantages.

Per group, over P = {passing rollouts with A_i > 0} and weights f_i ∈ (0, 1] from the grader, f̂_i = f_i / max_P f
(the top tier T = {i ∈ P: f̂_i = 1}, never empty; the rest of P is L, the lower tiers):

``form="paper"`` (the default; GAGAR as the paper states it): down-weight the lower tiers and give the removed
positive mass to the top tier, so the group's total positive advantage is unchanged:
    A'_i = (1 − s·(1 − f̂_i))·A_i                       for i ∈ L   (s = 1: A'_i = f̂_i·A_i)
    A'_i = A_i + R·A_i / Σ_T A,  R = Σ_L (A_i − A'_i)   for i ∈ T
    s = min(1, (cap − 1)·Σ_T A / Σ_L (1 − f̂_i)·A_i)     (cap None: s = 1)
The cap bounds the top tier's boost (A'_i ≤ cap·A_i on T) by removing *less* from the lower tiers — never by
dropping mass — so Σ_P A' = Σ_P A in every case (to float rounding). Invariants (tested with hypothesis):
  * sum preserved: Σ_P A' = Σ_P A;
  * no lower-ranked patch is boosted: A'_i ≤ A_i on L, A'_i ≥ A_i on T;
  * order by tier: the multiplier A'_i / A_i is non-decreasing in f_i (equal base advantages, as binary rewards
    give every passing rollout of a group, therefore keep the tiers' order: f_i > f_j ⇒ A'_i > A'_j);
  * failing rollouts, and passing ones with A_i ≤ 0, unchanged;
  * equal weights → the exact identity (T = P, R = 0);
  * no usable grading (a NaN weight on a rollout of P, or ``usable`` False) → the group unchanged;
  * A'_i > 0 on P, and a passing rollout that was above every failing rollout of its group stays above them
    (non-binary rewards can give a failing rollout A > 0): the down-weighting stops just above
    max(0, best failing A). The floor only lowers R, so the sum stays exact.

``form="scale"`` (the λ form of the design seed, kept as a named variant for comparison): A'_i = λ·f̂_i·A_i on P with
λ = min(cap, Σ_P A / Σ_P f̂·A). It preserves the sum only while the cap does not bind, and it *boosts* middle tiers
(tiers 1, 2, 3, 3, 3, 3: λ = 2.5, so the tier-2 rollout gets 1.5·A); both are why it is not the default.
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
FORMS = ("paper", "scale")


def _paper(a: Tensor, pos: Tensor, fhat: Tensor, lower_bound: Tensor, cap: float | None) -> Tensor:
    """(G, m) new advantages of the rollouts in P (``pos``) under the paper's form; see the module docstring."""
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    top = pos & (fhat >= 1.0)  # f / max f is exactly 1.0 at the maximum (x / x == 1 in IEEE arithmetic)
    low = pos & ~top
    top_sum = torch.where(top, a, zero).sum(1, keepdim=True)
    if cap is None:
        s = torch.ones_like(top_sum)
    else:
        full = torch.where(low, (1.0 - fhat) * a, zero).sum(1, keepdim=True)
        s = ((cap - 1.0) * top_sum / full.clamp(min=torch.finfo(a.dtype).tiny)).clamp(max=1.0)
    low_new = torch.maximum((1.0 - s * (1.0 - fhat)) * a, torch.minimum(lower_bound, a))
    removed = torch.where(low, a - low_new, zero).sum(1, keepdim=True)
    top_new = a + removed * (a / top_sum.clamp(min=torch.finfo(a.dtype).tiny))
    return torch.where(top, top_new, low_new)


def _scale(a: Tensor, pos: Tensor, fhat: Tensor, lower_bound: Tensor, cap: float | None) -> Tensor:
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    total = torch.where(pos, a, zero).sum(1, keepdim=True)
    lam = total / (fhat * a).sum(1, keepdim=True).clamp(min=torch.finfo(a.dtype).tiny)
    if cap is not None:
        lam = lam.clamp(max=cap)
    return torch.maximum(lam * fhat * a, torch.minimum(lower_bound, a))


def _redistribute(
    advantages: Tensor,
    passed: Tensor,
    weights: Tensor,
    index: IndexLike | None,
    usable: Tensor | None,
    cap: float | None,
    form: str,
) -> Tensor:
    if advantages.shape != passed.shape or advantages.shape != weights.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, passed {tuple(passed.shape)} and weights "
            f"{tuple(weights.shape)} must have the same shape"
        )
    if cap is not None and not cap >= 1.0:
        raise ValueError(f"cap must be >= 1 (it bounds the top tier's multiplier), got {cap}")
    if form not in FORMS + ("downweight",):
        raise ValueError(f"unknown GAGAR form {form!r}; choose one of {', '.join(FORMS)}")
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
    inf = torch.full((), math.inf, dtype=wd, device=a.device)
    pos = p & (a > 0)
    ok = ~(pos & ~torch.isfinite(w)).any(1, keepdim=True)  # (G, 1): every rollout of P has a weight
    if usable is not None:
        ok = ok & usable.to(device=a.device, dtype=torch.bool).reshape(-1, 1)
    w = torch.nan_to_num(torch.where(pos, w, zero), nan=0.0)  # NaNs outside P must not reach the sums
    # Lower bound of a moved advantage: just above max(0, best failing A) for a rollout that was above it, else
    # just above 0; never above the rollout's own base advantage (torch.minimum in the forms).
    failing = ~p if real is None else (~p & real)
    fail_max = torch.where(failing, a, -inf).amax(1, keepdim=True).clamp(min=0)
    above_fail = torch.nextafter(fail_max, inf)
    lower_bound = torch.where(a > above_fail, above_fail, torch.nextafter(zero, inf))
    if form == "downweight":
        new = torch.maximum(w * a, torch.minimum(lower_bound, a))
    else:
        fhat = w / w.amax(1, keepdim=True).clamp(min=torch.finfo(wd).tiny)
        new = (_paper if form == "paper" else _scale)(a, pos, fhat, lower_bound, cap)
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
    form: str = "paper",
) -> Tensor:
    """GAGAR redistribution (see the module docstring for the forms and their invariants).

    advantages, passed (bool), weights (f ∈ (0, 1], NaN = not graded): all (B, n), or all (N,) with ``index``.
    usable: optional (G,) bool — False leaves that group unchanged (G = B, or groups in sorted-label order).
    cap: ``paper``: the top tier's largest multiplier (the sum stays exact); ``scale``: λ's bound (the sum is
    lost when it binds). Default 3.0; None = uncapped. form: ``paper`` (default) or ``scale``.
    Returns advantages' shape, device and dtype.
    """
    return _redistribute(advantages, passed, weights, index, usable, cap, form)


def needs_grading(
    advantages: Tensor, passed: Tensor, index: IndexLike | None = None, *, per_rollout: bool = False
) -> Tensor:
    """Bool mask of groups worth a judge call: those where two or more passing rollouts have a positive base
    advantage.

    ``redistribute`` only moves advantage between passing rollouts with A > 0, so in any other group a grading
    cannot change a single advantage (e.g. binary rewards under GAPO once more than half the group passes:
    Q = 1, every passing A = 0; or one such rollout alone, which is its own top tier). advantages, passed:
    (B, n) -> (B,); or (N,) with ``index`` -> (G,), groups in sorted-label order (as ``mixed_outcome``).
    ``per_rollout=True`` broadcasts the mask back to the rollouts' shape. Pass the advantages *after* the hack
    verdicts already known (they make passing rollouts fail). Hack detection itself is not gated by this.
    """
    if advantages.shape != passed.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} and passed {tuple(passed.shape)} differ in shape")
    candidate = passed.to(device=advantages.device, dtype=torch.bool) & (advantages > 0)
    seg, c = layout(candidate, index)
    keep = c.sum(1) >= 2  # padding cells of a ragged layout are False
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
    """Ablation: A'_i = f_i·A_i for passing rollouts with A_i > 0, nothing moved to the top tier — the total
    positive signal shrinks (kept just above 0 and above the best failing rollout, as in ``redistribute``)."""
    return _redistribute(advantages, passed, weights, index, usable, None, "downweight")


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
    form: str = "paper",
    **params,
) -> Tensor:
    """The whole GAGAR step: hacks -> failures, baseline advantages (GAPO by default), redistribution."""
    if hacked is not None:
        rewards, passed = apply_hack_verdicts(rewards, passed, hacked, failure_reward=failure_reward)
    adv = compute_advantages(rewards, estimator=estimator, index=index, **params)
    return redistribute(adv, passed, weights, index=index, cap=cap, usable=usable, form=form)
