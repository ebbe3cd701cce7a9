"""Ranking metrics against known orders: top-1, pairwise accuracy and Kendall τ (sft reuses these).

All compare a predicted ranking with a gold order over the items both contain; items only one side has are
ignored, so a grading that also lists unstaged candidates is still comparable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any


def _common(pred: Sequence[str], gold: Sequence[str]) -> tuple[list[str], dict[str, int]]:
    gold_set = set(gold)
    p = [x for x in pred if x in gold_set]
    pos = {x: i for i, x in enumerate(p)}
    return [x for x in gold if x in pos], pos


def top1(pred: Sequence[str], gold: Sequence[str]) -> bool:
    """Whether the predicted best is the gold best."""
    g, pos = _common(pred, gold)
    if not g:
        return False
    return min(pos, key=pos.__getitem__) == g[0]


def _pairs(pred: Sequence[str], gold: Sequence[str]) -> tuple[int, int]:
    g, pos = _common(pred, gold)
    agree = disagree = 0
    for a, b in combinations(g, 2):  # gold says a before b
        if pos[a] < pos[b]:
            agree += 1
        else:
            disagree += 1
    return agree, disagree


def pairwise_accuracy(pred: Sequence[str], gold: Sequence[str]) -> float:
    """Fraction of gold-ordered pairs the prediction orders the same way (1.0 with fewer than two items)."""
    agree, disagree = _pairs(pred, gold)
    total = agree + disagree
    return agree / total if total else 1.0


def kendall_tau(pred: Sequence[str], gold: Sequence[str]) -> float:
    """Kendall τ-a between the two orders: 1 identical, −1 reversed (1.0 with fewer than two items)."""
    agree, disagree = _pairs(pred, gold)
    total = agree + disagree
    return (agree - disagree) / total if total else 1.0


def evaluate(predicted: Mapping[str, Sequence[str]], gold: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Mean metrics over the instances present in `gold`; an instance without a prediction scores 0 on each."""
    ids = sorted(gold)
    if not ids:
        return {"instances": 0, "graded": 0, "top1": 0.0, "pairwise_accuracy": 0.0, "kendall_tau": 0.0}
    t1 = pw = kt = 0.0
    graded = 0
    for iid in ids:
        pred = predicted.get(iid)
        if not pred:
            continue
        graded += 1
        t1 += float(top1(pred, gold[iid]))
        pw += pairwise_accuracy(pred, gold[iid])
        kt += kendall_tau(pred, gold[iid])
    n = len(ids)
    return {
        "instances": n,
        "graded": graded,
        "top1": t1 / n,
        "pairwise_accuracy": pw / n,
        "kendall_tau": kt / n,
    }
