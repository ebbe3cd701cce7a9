"""``compute_advantages``: dense (B, n) or flat (N,) + index rewards in, same-shaped advantages out."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .estimators import ESTIMATORS
from .segment import IndexLike, Segments, segments


def work_dtype(t: Tensor) -> torch.dtype:
    """float64 stays float64; everything else (bf16, fp16, fp32, ints, bool) is computed in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def out_dtype(t: Tensor) -> torch.dtype:
    return t.dtype if t.dtype.is_floating_point else torch.float32


def check_finite(rewards: Tensor, what: str = "rewards") -> None:
    if not rewards.is_floating_point() or rewards.numel() == 0:
        return
    # A finite sum proves every value finite, and one sum is several times cheaper on CPU than
    # isfinite().all(); only a non-finite sum (NaN/inf, or a float overflow) needs the elementwise check.
    if bool(rewards.sum().isfinite()) or bool(torch.isfinite(rewards).all()):
        return
    bad = int((~torch.isfinite(rewards)).sum())
    raise ValueError(
        f"{bad} of {rewards.numel()} {what} are NaN or infinite; fix or drop those rollouts "
        "(e.g. give a crashed rollout the failure reward) before computing advantages"
    )


def grouped(
    rewards: Tensor, index: IndexLike | None, fn: Callable[[Tensor, Tensor | None], Tensor]
) -> Tensor:
    """Run ``fn(x (G, m) work-dtype, sizes (G,) | None) -> (G, m)`` over rewards laid out by group.

    rewards: (B, n) with index None, or (N,) with index (N,). Returns rewards' shape, device and dtype
    (float32 for integer/bool rewards).
    """
    x = rewards.to(work_dtype(rewards))
    if index is None:
        if rewards.dim() != 2:
            raise ValueError(
                f"rewards of shape {tuple(rewards.shape)}: pass a dense (B, n) tensor, or a flat (N,) tensor "
                "together with index= giving each rollout's group"
            )
        if rewards.shape[1] == 0:
            return rewards.to(out_dtype(rewards)).clone()
        return fn(x, None).to(out_dtype(rewards))
    if rewards.dim() != 1:
        raise ValueError(f"with index=, rewards must be flat (N,), got shape {tuple(rewards.shape)}")
    seg = segments(index, rewards.shape[0], rewards.device)
    if seg.num_groups == 0:
        return rewards.to(out_dtype(rewards)).clone()
    dense = seg.to_dense(x)
    out = fn(dense, None if seg.uniform else seg.sizes)
    return seg.to_flat(out).to(out_dtype(rewards))


def compute_advantages(
    rewards: Tensor, *, estimator: str = "gapo", index: IndexLike | None = None, **params
) -> Tensor:
    """Group-relative advantages.

    rewards: (B, n) — B groups of n rollouts — or (N,) with ``index`` (N,) of int or string group labels
    (any order, ragged sizes). estimator: a name in ``ESTIMATORS`` (grpo, dr_grpo, rloo, gapo, or yours);
    params go to it (gapo: coverage, eps, center, norm). Returns the advantages with rewards' shape, device and
    dtype, computed in float32 (float64 kept). Raises ValueError on NaN/inf rewards or an unknown estimator.
    """
    try:
        fn = ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown estimator {estimator!r}; known: {sorted(ESTIMATORS)}") from None
    check_finite(rewards)
    return grouped(rewards, index, lambda x, sizes: fn(x, sizes, **params))


def layout(t: Tensor, index: IndexLike | None) -> tuple[Segments | None, Tensor]:
    """(B, n) -> (None, itself); (N,) + index -> (segments, (G, m) padded view). Used by GAGAR helpers."""
    if index is None:
        if t.dim() != 2:
            raise ValueError(f"expected a dense (B, n) tensor without index=, got shape {tuple(t.shape)}")
        return None, t
    if t.dim() != 1:
        raise ValueError(f"with index=, expected a flat (N,) tensor, got shape {tuple(t.shape)}")
    seg = segments(index, t.shape[0], t.device)
    return seg, seg.to_dense(t)
