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
        ``torch.unique`` / ``np.unique`` order them).
    pos: (N,) long — position of the rollout inside its group (stable: original order kept).
    sizes: (G,) long — rollouts per group.
    width: int — m = max(sizes).
    cell: (N,) long — each rollout's cell in the flattened (G·m,) layout: group·m + pos.
    """

    group: Tensor
    pos: Tensor
    sizes: Tensor
    width: int
    cell: Tensor

    @property
    def num_groups(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def uniform(self) -> bool:
        return bool((self.sizes == self.width).all())


    def to_dense(self, values: Tensor, fill: float | bool = 0) -> Tensor:
        """(N,) -> (G, m); padding cells hold ``fill``."""
        # index_copy_/index_select: advanced-index assignment (out[g, p] = v) is ~1000x slower on CPU
        out = values.new_full((self.num_groups * self.width,), fill)
        return out.index_copy_(0, self.cell, values).view(self.num_groups, self.width)

    def to_flat(self, dense: Tensor) -> Tensor:
        """(G, m) -> (N,)."""
        return dense.reshape(-1).index_select(0, self.cell)


def group_ids(index: IndexLike, n: int, device: torch.device) -> Tensor:
    """Labels (ints or strings, any order) -> dense group numbers (N,) long on ``device``."""
    if isinstance(index, Tensor):
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise TypeError(f"index must hold integer or string labels, got a {index.dtype} tensor")
        if index.shape != (n,):
            raise ValueError(f"index has shape {tuple(index.shape)}, rewards have {n} rollouts: expected ({n},)")
        return torch.unique(index.to(device), return_inverse=True)[1]
    arr = np.asarray(index)
    if arr.shape != (n,):
        raise ValueError(f"index has shape {arr.shape}, rewards have {n} rollouts: expected ({n},)")
    if arr.dtype == object:  # verl passes uids as an object array of str
        arr = arr.astype(str)
    if arr.dtype.kind == "f":
        raise TypeError("index must hold integer or string labels, got floats")
    inverse = np.unique(arr, return_inverse=True)[1].reshape(-1)
    return torch.as_tensor(inverse, dtype=torch.long, device=device)


def segments(index: IndexLike, n: int, device: torch.device) -> Segments:
    """Build the flat -> dense mapping for ``n`` rollouts labelled by ``index`` (shape (N,))."""
    group = group_ids(index, n, device)
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Segments(empty, empty, empty, 0, empty)
    sizes = torch.bincount(group)
    order = torch.sort(group, stable=True)[1]
    starts = torch.cumsum(sizes, 0) - sizes
    pos = torch.empty_like(group).scatter_(0, order, torch.arange(n, device=device) - starts[group[order]])
    width = int(sizes.max())
    return Segments(group, pos, sizes, width, group * width + pos)

