"""Combining the rankings of several judge permutations: Borda count, tiers, and their agreement."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from statistics import median_low

from grader.metrics import pairwise_accuracy


def borda(rankings: Sequence[Sequence[str]]) -> list[str]:
    """Borda count: in a list of n, position p earns n−1−p points; ties go to the better best position, then id."""
    points: dict[str, float] = {}
    best: dict[str, int] = {}
    for ranking in rankings:
        n = len(ranking)
        for p, item in enumerate(ranking):
            points[item] = points.get(item, 0.0) + (n - 1 - p)
            best[item] = min(best.get(item, p), p)
    return sorted(points, key=lambda x: (-points[x], best[x], x))


def agreement(rankings: Sequence[Sequence[str]]) -> float:
    """Mean pairwise-order agreement between every two runs: 1.0 when all permutations ranked alike."""
    if len(rankings) < 2:
        return 1.0
    scores = [pairwise_accuracy(a, b) for a, b in combinations(rankings, 2)]
    return round(sum(scores) / len(scores), 4)


def aggregate_tiers(tier_runs: Sequence[dict[str, int]], ranking: Sequence[str]) -> dict[str, int]:
    """Median (lower) tier per item, then made monotone along `ranking` so a tier never improves downwards."""
    tiers: dict[str, int] = {}
    floor = 1
    for item in ranking:
        seen = [t[item] for t in tier_runs if item in t]
        t = max(median_low(seen) if seen else 3, floor)
        tiers[item] = t
        floor = t
    return tiers
