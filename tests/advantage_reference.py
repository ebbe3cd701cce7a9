"""Independent plain-Python reference for the advantage engine (lists, sorted(), an explicit window loop).

Written from DESIGN.md's formulas without looking at the torch code; float64 throughout.
"""

from __future__ import annotations

import math


def gapo_ref(rewards: list[float], coverage=0.5, eps=1e-6, center="median", norm=True) -> list[float]:
    n = len(rewards)
    s = sorted(rewards)
    k = min(max(math.ceil(coverage * n), 1), n)
    best = None
    for start in range(n - k + 1):  # strict < keeps the lowest window on ties
        width = s[start + k - 1] - s[start]
        if best is None or width < best[0]:
            best = (width, start)
    window = s[best[1] : best[1] + k]
    if center == "mean":
        q = sum(window) / k
    elif k % 2:
        q = window[k // 2]
    else:
        q = (window[k // 2 - 1] + window[k // 2]) / 2
    if not norm:
        return [r - q for r in rewards]
    d = math.sqrt(sum((r - q) ** 2 for r in rewards) / max(n - 1, 1))
    return [(r - q) / (d + eps) for r in rewards]


def grpo_ref(rewards: list[float], eps=1e-6, norm=True) -> list[float]:
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(n - 1, 1))
    return [(r - mean) / (std + eps) if norm else r - mean for r in rewards]


def rloo_ref(rewards: list[float]) -> list[float]:
    n = len(rewards)
    if n == 1:
        return [0.0]
    total = sum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


REFS = {
    "gapo": gapo_ref,
    "grpo": grpo_ref,
    "dr_grpo": lambda r: grpo_ref(r, norm=False),
    "rloo": rloo_ref,
}


def grouped_ref(rewards: list[float], index: list, fn) -> list[float]:
    groups: dict = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for members in groups.values():
        adv = fn([rewards[i] for i in members])
        for i, a in zip(members, adv, strict=True):
            out[i] = a
    return out


def redistribute_ref(adv: list[float], passed: list[bool], weights: list[float], cap=3.0) -> list[float]:
    """One group. Passing rollouts with A > 0 are floored just above max(0, best failing advantage)."""
    pos = [i for i in range(len(adv)) if passed[i] and adv[i] > 0]
    if not pos or any(math.isnan(weights[i]) for i in pos):
        return list(adv)
    top = max(weights[i] for i in pos)
    f = {i: weights[i] / top for i in pos}
    lam = sum(adv[i] for i in pos) / sum(f[i] * adv[i] for i in pos)
    if cap is not None:
        lam = min(lam, cap)
    floor = max([0.0] + [adv[i] for i in range(len(adv)) if not passed[i]])
    return [max(lam * f[i] * adv[i], floor) if i in f else adv[i] for i in range(len(adv))]
