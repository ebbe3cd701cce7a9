"""Independent plain-Python reference for the advantage engine (lists, sorted(), an explicit window loop).

Written from the formulas in docs/advantage.md without looking at the torch code. GAPO runs in exact rational
arithmetic (``fractions.Fraction``): pass rewards as Fractions (thirds, tenths, ...) and its window choice and
centre are exact, so a tie is a true tie; only the final square root and division are float64.
"""

from __future__ import annotations

import math
from fractions import Fraction


def gapo_ref(rewards: list, coverage=0.5, eps=1e-6, center="median", norm=True) -> list[float]:
    """GAPO of one group. rewards: ints, floats (taken at their exact binary value) or Fractions."""
    r = [Fraction(v) for v in rewards]
    n = len(r)
    s = sorted(r)
    tau = Fraction(str(coverage))  # the decimal as written: 0.55 is 11/20
    k = min(max(math.ceil(tau * n), 1), n)
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
        return [float(v - q) for v in r]
    d = math.sqrt(float(sum((v - q) ** 2 for v in r)) / max(n - 1, 1))
    return [float(v - q) / (d + eps) for v in r]


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
