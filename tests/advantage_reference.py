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
    starts = range(n - k + 1)
    widths = [s[j + k - 1] - s[j] for j in starts]
    narrowest = min(widths)

    def centre(window: list) -> Fraction:
        if center == "mean":
            return sum(window) / k
        if k % 2:
            return window[k // 2]
        return (window[k // 2 - 1] + window[k // 2]) / 2

    # every window as narrow as the narrowest (an exact tie in rational arithmetic): the mean of their centres
    tied = [centre(s[j : j + k]) for j in starts if widths[j] == narrowest]
    q = sum(tied) / len(tied)
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


def redistribute_ref(adv: list[float], passed: list[bool], weights: list[float], cap=3.0,
                     form: str = "paper") -> list[float]:
    """One group, written from docs/advantage.md. P = passing rollouts with A > 0; f̂ = f / max f over P."""
    pos = [i for i in range(len(adv)) if passed[i] and adv[i] > 0]
    if not pos or any(math.isnan(weights[i]) for i in pos):
        return list(adv)
    top_w = max(weights[i] for i in pos)
    f = {i: weights[i] / top_w for i in pos}
    fail_max = max([0.0] + [adv[i] for i in range(len(adv)) if not passed[i]])

    def bound(i: int) -> float:  # just above the best failing rollout if it was above it, else just above 0
        above = math.nextafter(fail_max, math.inf)
        return min(above if adv[i] > above else math.nextafter(0.0, 1.0), adv[i])

    out = list(adv)
    if form == "scale":
        lam = sum(adv[i] for i in pos) / sum(f[i] * adv[i] for i in pos)
        lam = lam if cap is None else min(lam, cap)
        for i in pos:
            out[i] = max(lam * f[i] * adv[i], bound(i))
        return out
    top = [i for i in pos if f[i] == 1.0]
    low = [i for i in pos if f[i] < 1.0]
    top_sum = sum(adv[i] for i in top)
    full = sum((1 - f[i]) * adv[i] for i in low)
    s = 1.0 if cap is None or full == 0 else min(1.0, (cap - 1) * top_sum / full)
    for i in low:
        out[i] = max((1 - s * (1 - f[i])) * adv[i], bound(i))
    removed = sum(adv[i] - out[i] for i in low)
    for i in top:
        out[i] = adv[i] + removed * adv[i] / top_sum
    return out
