"""From `RolloutGroup`s to advantage tensors: dynamic sampling, base advantages, GAGAR redistribution.

Rewards are binary: 1 for a rollout that `passed` (hacks already reset to failure), 0 otherwise. Rollouts whose
sandbox failed (`valid` False) take no part: the estimators see each group without them (ragged groups, flat
layout with an index), and their advantage is 0 — the update leaves them out of the loss as well.
Tensors are dense (B, n_max), padded with 0 / False.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainer.advantage import compute_advantages, downweight, mixed_outcome, needs_grading, redistribute
from trainer.config import AdvantageConfig
from trainer.groups import RolloutGroup


def _dense(groups: list[RolloutGroup], values: list[list], fill, dtype) -> Tensor:
    width = max((len(g.trajs) for g in groups), default=0)
    return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=dtype).reshape(len(groups), width)


def masks(groups: list[RolloutGroup]) -> tuple[Tensor, Tensor]:
    """(passed, valid), both (B, n_max) bool; padding is invalid."""
    return (_dense(groups, [g.passed for g in groups], False, torch.bool),
            _dense(groups, [g.valid for g in groups], False, torch.bool))


def _flat_index(valid: Tensor) -> tuple[Tensor, Tensor]:
    """(positions of the valid rollouts in the dense layout, their group index), for the flat (N,) API."""
    pos = valid.flatten().nonzero().squeeze(1)
    return pos, pos // max(1, valid.shape[1])


def keep_mask(groups: list[RolloutGroup]) -> list[bool]:
    """Dynamic sampling on the final verdicts: keep groups whose valid rollouts both pass and fail."""
    passed, valid = masks(groups)
    pos, index = _flat_index(valid)
    keep = [False] * len(groups)
    if len(pos):
        mixed = mixed_outcome(passed.flatten()[pos], index)  # groups in sorted-label order
        for b, k in zip(torch.unique(index).tolist(), mixed.tolist(), strict=True):
            keep[b] = bool(k)
    return keep


def _params(a: AdvantageConfig) -> dict:
    return {"gapo": {"coverage": a.coverage, "center": a.center, "norm": a.norm, "eps": a.eps},
            "grpo": {"eps": a.eps, "norm": a.norm}}.get(a.estimator, {})


def base_advantages(groups: list[RolloutGroup], a: AdvantageConfig) -> Tensor:
    """The baseline estimator (GRPO / GAPO / ...) on binary rewards, each group over its valid rollouts only."""
    passed, valid = masks(groups)
    out = torch.zeros(passed.shape, dtype=torch.float32)
    pos, index = _flat_index(valid)
    if len(pos):
        rewards = passed.flatten()[pos].float()
        out.view(-1)[pos] = compute_advantages(rewards, estimator=a.estimator, index=index, **_params(a))
    return out


def needs_ranking(groups: list[RolloutGroup], base: Tensor) -> list[bool]:
    """GAGAR moves advantage only between two or more passing rollouts with A > 0 (`needs_grading`): elsewhere
    the judge's ranking would change nothing, so it is not asked."""
    passed, valid = masks(groups)
    return [bool(n) for n in needs_grading(base, passed & valid).tolist()]


def quality_weights(groups: list[RolloutGroup]) -> tuple[Tensor, Tensor]:
    """(weights (B, n_max) with NaN where there is none, usable (B,)): a judge's own ranking only — a
    fallback ranking leaves the group's advantages as they are."""
    width = max((len(g.trajs) for g in groups), default=0)
    weights = torch.full((len(groups), width), math.nan)
    usable = torch.zeros(len(groups), dtype=torch.bool)
    for b, g in enumerate(groups):
        if g.ranking is not None and not g.ranking.fallback:
            usable[b] = True
            for k, rid in enumerate(g.rollout_ids):
                if rid in g.ranking.weights:
                    weights[b, k] = float(g.ranking.weights[rid])
    return weights, usable


def redistribute_groups(groups: list[RolloutGroup], base: Tensor, a: AdvantageConfig) -> Tensor:
    """GAGAR (or the downweight ablation) on top of the base advantages; invalid rollouts stay at 0."""
    if a.redistribution == "none" or not groups:
        return base
    passed, valid = masks(groups)
    weights, usable = quality_weights(groups)
    fn = redistribute if a.redistribution == "gagar" else downweight
    kwargs = {"cap": a.cap, "form": a.gagar_form} if a.redistribution == "gagar" else {}
    out = fn(base, passed & valid, weights, usable=usable, **kwargs)
    return torch.where(valid, out, torch.zeros_like(out))


def redistribution_stats(groups: list[RolloutGroup], before: Tensor, after: Tensor) -> dict[str, float | int]:
    """What GAGAR did this step, for the metrics and the advantage panel: over the passing rollouts it could
    move (A > 0 in a group with a usable ranking), the highest and lowest advantage before and after."""
    if not groups:
        return {"gagar_groups": 0, "gagar_moved": 0}
    passed, valid = masks(groups)
    _, usable = quality_weights(groups)
    moved = passed & valid & (before > 0) & usable[:, None]
    # gagar_groups: groups GAGAR could act on (a usable ranking, a positive passing advantage); gagar_moved: those
    # where it changed an advantage (equal weights, or a lone pass, leave a group as it was)
    row: dict[str, float | int] = {"gagar_groups": int(moved.any(1).sum()),
                                   "gagar_moved": int((moved & (after != before)).any(1).sum())}
    if bool(moved.any()):
        row.update(adv_pass_max_before=float(before[moved].max()), adv_pass_min_before=float(before[moved].min()),
                   adv_pass_max_after=float(after[moved].max()), adv_pass_min_after=float(after[moved].min()))
    return row
