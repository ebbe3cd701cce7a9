"""Dynamic sampling (DAPO / GAGAR): keep only groups with both passing and failing rollouts."""

from __future__ import annotations

import torch
from torch import Tensor

from .core import layout
from .segment import IndexLike


def mixed_outcome(passed: Tensor, index: IndexLike | None = None, *, per_rollout: bool = False) -> Tensor:
    """Bool mask of groups to keep: those with at least one passing and one failing rollout.

    passed: (B, n) bool -> (B,); or (N,) with ``index`` -> (G,), groups in sorted-label order (the order of
    ``torch.unique`` / ``np.unique``). ``per_rollout=True`` broadcasts the mask back to passed's shape.
    A group of 1 is never mixed.
    """
    seg, p = layout(passed.to(torch.bool), index)
    if seg is None:
        keep = p.any(1) & ~p.all(1)
        return keep[:, None].expand_as(p).clone() if per_rollout else keep
    count = torch.zeros(seg.num_groups, dtype=torch.long, device=p.device).index_add_(
        0, seg.group, passed.to(torch.bool).long()
    )
    keep = (count > 0) & (count < seg.sizes)
    return keep[seg.group] if per_rollout else keep
