"""Flat rollouts + a group index  <->  a dense, padded (G, m) layout, without a Python loop over groups.

Every estimator works on a dense ``(G, m)`` tensor plus the true group sizes; this module maps a flat ``(N,)``
tensor whose group labels are arbitrary (ints, strings, ragged sizes) into that layout and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

IndexLike = Tensor | np.ndarray | Sequence


@dataclass(frozen=True)
class Segments:
    """Where each flat rollout sits in the padded layout.

    group: (N,) long — dense group number of each rollout (groups numbered in sorted-label order, as
        ``torch.unique`` / ``np.unique`` order them; strings sort as Python strings).
    pos: (N,) long — position of the rollout inside its group (stable: original order kept).
    sizes: (G,) long — rollouts per group.
    width: int — m = max(sizes).
    cell: (N,) long — each rollout's cell in the flattened (G·m,) layout: group·m + pos; None (and pos None)
        when the rollouts already lie group after group in equal groups, so the layout is a reshape.
    """

    group: Tensor
    pos: Tensor | None
    sizes: Tensor
    width: int
    cell: Tensor | None

    @property
    def num_groups(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def uniform(self) -> bool:
        return bool((self.sizes == self.width).all())

    def to_dense(self, values: Tensor, fill: float | bool = 0) -> Tensor:
        """(N,) -> (G, m); padding cells hold ``fill``."""
        if self.cell is None:
            return values.reshape(self.num_groups, self.width)
        # index_copy_/index_select: advanced-index assignment (out[g, p] = v) is ~1000x slower on CPU
        out = values.new_full((self.num_groups * self.width,), fill)
        return out.index_copy_(0, self.cell, values).view(self.num_groups, self.width)

    def to_flat(self, dense: Tensor) -> Tensor:
        """(G, m) -> (N,)."""
        if self.cell is None:
            return dense.reshape(-1)
        return dense.reshape(-1).index_select(0, self.cell)


def _codes(index: IndexLike, n: int, device: torch.device) -> Tensor:
    """Labels -> (N,) long tensor whose order matches the labels' order (ints kept, strings ranked)."""
    if isinstance(index, Tensor):
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise TypeError(f"index must hold integer or string labels, got a {index.dtype} tensor")
        if index.shape != (n,):
            raise ValueError(f"index has shape {tuple(index.shape)}, rewards have {n} rollouts: expected ({n},)")
        return index.to(device=device, dtype=torch.long)
    arr = np.asarray(index)
    if arr.shape != (n,):
        raise ValueError(f"index has shape {arr.shape}, rewards have {n} rollouts: expected ({n},)")
    if arr.dtype.kind == "f":
        raise TypeError("index must hold integer or string labels, got floats")
    if arr.dtype.kind in "iu":
        return torch.as_tensor(arr, dtype=torch.long, device=device)
    # strings (verl passes uids as an object array of str): hash-factorise in O(N), ranking only the uniques
    try:
        import pandas as pd

        codes = pd.factorize(arr.astype(str) if arr.dtype == object else arr, sort=True)[0]
    except ImportError:  # pandas comes with datasets; numpy's sort-based unique is the slower fallback
        codes = np.unique(arr.astype(str), return_inverse=True)[1].reshape(-1)
    return torch.as_tensor(codes, dtype=torch.long, device=device)


def segments(index: IndexLike, n: int, device: torch.device) -> Segments:
    """Build the flat -> dense mapping for ``n`` rollouts labelled by ``index`` (shape (N,)).

    One stable sort of the labels (skipped when they are already non-decreasing, the usual layout of TRL and
    verl batches), then run-length boundaries give the group numbers, sizes and in-group positions.
    """
    codes = _codes(index, n, device)
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Segments(empty, empty, empty, 0, empty)
    grouped_already = bool((codes[1:] >= codes[:-1]).all())
    if grouped_already:
        ordered, order = codes, None
    else:
        ordered, order = torch.sort(codes, stable=True)
    _, group_sorted, sizes = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    width = int(sizes.max())
    if order is None and width * sizes.shape[0] == n:  # consecutive equal groups: the layout is a plain view
        return Segments(group_sorted, None, sizes, width, None)
    starts = torch.cumsum(sizes, 0) - sizes
    pos_sorted = torch.arange(n, device=device) - starts[group_sorted]
    if order is None:
        group, pos = group_sorted, pos_sorted
    else:
        group = torch.empty_like(group_sorted).scatter_(0, order, group_sorted)
        pos = torch.empty_like(pos_sorted).scatter_(0, order, pos_sorted)
    return Segments(group, pos, sizes, width, group * width + pos)
