"""Reward-distribution experiment: GRPO's mean/std baseline vs GAPO's robust one on skewed groups.

Rewards are continuous partial credit, ``r = 0.7 · (tests passed / m) + 0.3 · diff similarity``, generated
from a latent true quality ``q`` per rollout (``tests passed ~ Binomial(m, q)``, similarity = ``q`` plus
jitter). Each group's ``q`` comes from one of four shapes, in the proportions the GAPO paper measured on
real rollout groups (68% normal, 15.5% left-skewed, 14.4% right-skewed; the remaining 2.1% we give to
groups with one or two extreme members, "outlier"). The latent ``q`` is the ground truth: it is what the
observed reward measures with noise.

Metrics, per estimator and per group shape (all defined precisely in ``docs/experiments.md``):
- ``sign_error_rank`` — the true ranking of a group is the order of ``q``; the upper half of it should be
  reinforced and the lower half penalised (``s_i = +1`` / ``-1``, n is even). A rollout's advantage is a full
  sign error when ``A_i · s_i < 0`` and half an error when ``A_i = 0``: a zero advantage gives the rollout no
  push in the direction it should go (counting it as correct favoured an estimator that zeroes many
  advantages, as GAPO does at its centre).
- ``sign_error_value`` — the same against the policy-gradient baseline instead of the ranking:
  ``s_i = sign(q_i − E[q])`` with ``E[q]`` the population mean of the group's generating distribution (A = 0 is
  half an error here too). It is reported beside the rank definition because the two disagree on skewed groups.
- ``sign_error_rank_strict`` — the former definition (A = 0 never an error), kept for comparison.
- ``zero_adv`` — share of rollouts whose advantage is exactly 0 (no learning signal).
- ``adv_var`` — the variance of all advantages pooled (≈1 for any std-normalised estimator).
- ``rank_var`` — the variance, across replicate groups drawn from the same distribution, of the advantage
  given to the rollout at a fixed true rank, averaged over ranks: how much the signal a rollout of a given
  true standing receives depends on which other rollouts happened to be sampled.
- ``clip_frac`` — share of (rollout, epoch) pairs whose PPO ratio is clipped during a PPO-style update in
  which each rollout's sequence log-probability is its own parameter (the large-vocabulary limit where one
  rollout's update barely moves another's probability), SGD on the clipped surrogate.
- ``clip_frac_matched`` — the same after scaling each estimator's advantages (one constant per seed) to a mean
  |A| of 1: how often a ratio is clipped depends on how large the advantages are, so an estimator with smaller
  |A| (GAPO's deviation is taken around its centre, not the mean, so it is larger than the std) is clipped less
  for that reason alone; this variant compares the estimators at equal step size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from trainer.advantage import compute_advantages

SHAPES = ("normal", "left_skewed", "right_skewed", "outlier")
# GAPO paper's measured shares; what the three named shapes leave over goes to outlier groups.
PROPORTIONS = (0.68, 0.155, 0.144, 0.021)
REWARDS = ("partial", "exact", "tests")


@dataclass
class SkewConfig:
    n: int = 16  # rollouts per group (even, so the true ranking splits into two halves)
    configs: int = 1500  # distinct group distributions per seed
    replicates: int = 16  # groups drawn from each distribution (for rank_var)
    tests: int = 20  # m, tests per task for the partial credit
    epochs: int = 4  # PPO epochs over the batch
    lr: float = 0.1  # SGD step on each rollout's log-probability
    clip_eps: float = 0.2
    estimators: tuple[str, ...] = ("grpo", "gapo")
    # "partial": the partial-credit reward (noisy measurement of q); "exact": r = q, which isolates the
    # estimators' choice of centre from measurement noise; "tests": r = tests passed / m alone, a grid of
    # 1/m steps where equal window widths (GAPO's ties) are common and not exact in binary floating point.
    reward: str = "partial"

    def __post_init__(self) -> None:
        if self.n < 4 or self.n % 2:
            raise ValueError("n must be an even number >= 4 (the true ranking splits into halves)")
        if self.configs < 1 or self.replicates < 2:
            raise ValueError("configs must be >= 1 and replicates >= 2")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if self.epochs < 1:
            raise ValueError("steps (PPO epochs) must be >= 1")


def _draw_q(rng: np.random.Generator, shape: int, size: tuple[int, ...], p: np.ndarray) -> np.ndarray:
    """Latent qualities for `size[0]` distributions × the rest; `p` holds each distribution's parameters."""
    c = size[0]
    extra = (1,) * (len(size) - 1)
    a, b = p[:, 0].reshape((c,) + extra), p[:, 1].reshape((c,) + extra)
    if shape == 0:  # normal around a middling mean
        q = a + b * rng.standard_normal(size)
    elif shape == 1:  # most rollouts good, a long tail of bad ones
        q = a - rng.exponential(1.0, size) * b
    elif shape == 2:  # most rollouts poor, a long tail of good ones
        q = a + rng.exponential(1.0, size) * b
    else:  # a tight normal body; outliers are added by the caller
        q = a + b * rng.standard_normal(size)
    return np.clip(q, 0.0, 1.0)


def _params(rng: np.random.Generator, shape: int, c: int) -> np.ndarray:
    if shape == 0:
        return np.stack([rng.uniform(0.3, 0.7, c), rng.uniform(0.08, 0.15, c)], 1)
    if shape == 1:
        return np.stack([rng.uniform(0.75, 0.95, c), rng.uniform(0.1, 0.2, c)], 1)
    if shape == 2:
        return np.stack([rng.uniform(0.05, 0.25, c), rng.uniform(0.1, 0.2, c)], 1)
    return np.stack([rng.uniform(0.25, 0.75, c), rng.uniform(0.03, 0.08, c)], 1)


def generate(rng: np.random.Generator, cfg: SkewConfig) -> dict[str, np.ndarray]:
    """Draw `configs` group distributions × `replicates` groups × `n` rollouts.

    Returns shape ids (C,), latent q (C, R, n), rewards (C, R, n) and each distribution's population mean
    of q (C,), estimated from 512 extra draws so that clipping at 0 and 1 is accounted for.
    """
    c, r, n = cfg.configs, cfg.replicates, cfg.n
    shapes = rng.choice(len(SHAPES), size=c, p=np.asarray(PROPORTIONS) / sum(PROPORTIONS))
    q = np.empty((c, r, n))
    pop_mean = np.empty(c)
    for s in range(len(SHAPES)):
        idx = np.flatnonzero(shapes == s)
        if idx.size == 0:
            continue
        p = _params(rng, s, idx.size)
        qs = _draw_q(rng, s, (idx.size, r, n), p)
        big = _draw_q(rng, s, (idx.size, 512), p)
        if s == 3:
            # One extreme member per group (two in 30% of groups), at the far end from the body.
            hi = p[:, 0] < 0.5
            extreme = np.where(hi, rng.uniform(0.95, 1.0, idx.size), rng.uniform(0.0, 0.05, idx.size))
            qs[:, :, 0] = extreme[:, None]
            two = rng.random(idx.size) < 0.3
            qs[two, :, 1] = extreme[two, None]
            k = 1.0 + two  # extreme members in each of this distribution's groups
            pop_mean_s = (big.mean(1) * (n - k) + extreme * k) / n
        else:
            pop_mean_s = big.mean(1)
        q[idx] = qs
        pop_mean[idx] = pop_mean_s
    if cfg.reward == "exact":
        rewards = q.copy()
    elif cfg.reward == "tests":
        rewards = rng.binomial(cfg.tests, q) / cfg.tests
    else:
        passed = rng.binomial(cfg.tests, q) / cfg.tests
        similarity = np.clip(q + 0.05 * rng.standard_normal(q.shape), 0.0, 1.0)
        rewards = 0.7 * passed + 0.3 * similarity
    return {"shapes": shapes, "q": q, "rewards": rewards, "pop_mean": pop_mean}


def true_rank_signs(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """+1 for the upper half of each group's true ranking, -1 for the lower half (random tie-break)."""
    jitter = rng.random(q.shape) * 1e-9  # ties only come from clipping at 0/1; break them at random
    order = np.argsort(np.argsort(q + jitter, axis=-1), axis=-1)
    return np.where(order >= q.shape[-1] // 2, 1.0, -1.0)


def ppo_clip_fraction(adv: np.ndarray, cfg: SkewConfig) -> np.ndarray:
    """Per-rollout share of epochs in which the clipped PPO surrogate has no gradient.

    Each rollout's log-probability θ_i starts at the behaviour policy's (ratio 1) and takes SGD steps on
    min(ρA, clip(ρ, 1±ε)A); a step is "clipped" when ρ has left the band in the direction A pushes it.
    """
    theta = np.zeros_like(adv)
    clipped = np.zeros_like(adv)
    for _ in range(cfg.epochs):
        ratio = np.exp(theta)
        is_clipped = ((adv > 0) & (ratio > 1 + cfg.clip_eps)) | ((adv < 0) & (ratio < 1 - cfg.clip_eps))
        clipped += is_clipped
        theta = theta + np.where(is_clipped, 0.0, cfg.lr * ratio * adv)
    return clipped / cfg.epochs


def sign_errors(adv: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Per rollout: 1 for an advantage of the wrong sign, 1/2 for a zero one (no push either way), else 0."""
    return np.where(adv * sign < 0, 1.0, np.where(adv == 0, 0.5, 0.0))


def _metrics(adv: np.ndarray, data: dict[str, np.ndarray], s_rank: np.ndarray, cfg: SkewConfig) -> dict:
    q = data["q"]
    s_value = np.sign(q - data["pop_mean"][:, None, None])
    # Rank-conditional variance: sort each replicate's advantages by true quality, then take the variance
    # over replicates at every rank position.
    order = np.argsort(q, axis=-1, kind="stable")
    by_rank = np.take_along_axis(adv, order, axis=-1)
    rank_var = by_rank.var(axis=1, ddof=1).mean(-1)  # (C,)
    clip = ppo_clip_fraction(adv, cfg).mean(axis=(1, 2))
    matched = ppo_clip_fraction(adv / max(float(np.abs(adv).mean()), 1e-12), cfg).mean(axis=(1, 2))
    has_value = s_value != 0
    per_config = {
        "sign_error_rank": sign_errors(adv, s_rank).mean(axis=(1, 2)),
        "sign_error_rank_strict": ((adv * s_rank) < 0).mean(axis=(1, 2)),
        "sign_error_value": (sign_errors(adv, s_value) * has_value).sum(axis=(1, 2))
        / np.maximum(has_value.sum(axis=(1, 2)), 1),
        "zero_adv": (adv == 0).mean(axis=(1, 2)),
        "rank_var": rank_var,
        "clip_frac": clip,
        "clip_frac_matched": matched,
        "mean_abs_adv": np.abs(adv).mean(axis=(1, 2)),
    }
    out: dict[str, dict[str, float]] = {}
    for name in ("all",) + SHAPES:
        mask = np.ones(len(data["shapes"]), bool) if name == "all" else data["shapes"] == SHAPES.index(name)
        if not mask.any():
            continue
        row = {k: float(v[mask].mean()) for k, v in per_config.items()}
        row["adv_var"] = float(adv[mask].var(ddof=1))
        out[name] = row
    return out


def sample_skewness(x: np.ndarray) -> np.ndarray:
    """Adjusted Fisher–Pearson skewness along the last axis."""
    n = x.shape[-1]
    d = x - x.mean(-1, keepdims=True)
    m2, m3 = (d**2).mean(-1), (d**3).mean(-1)
    g1 = m3 / np.maximum(m2, 1e-12) ** 1.5
    return g1 * math.sqrt(n * (n - 1)) / (n - 2)


def run_seed(seed: int, cfg: SkewConfig) -> dict:
    rng = np.random.default_rng(seed)
    data = generate(rng, cfg)
    s_rank = true_rank_signs(data["q"], rng)
    c, r, n = data["rewards"].shape
    rewards = torch.as_tensor(data["rewards"].reshape(c * r, n), dtype=torch.float64)
    result: dict = {"seed": seed, "estimators": {}}
    for est in cfg.estimators:
        adv = compute_advantages(rewards, estimator=est).numpy().reshape(c, r, n)
        if not np.isfinite(adv).all():
            raise RuntimeError(f"estimator {est!r} produced non-finite advantages")
        result["estimators"][est] = _metrics(adv, data, s_rank, cfg)
    skew = sample_skewness(data["rewards"]).mean(1)
    result["calibration"] = {
        name: {
            "share": float((data["shapes"] == i).mean()),
            "mean_sample_skewness": float(skew[data["shapes"] == i].mean()) if (data["shapes"] == i).any() else None,
        }
        for i, name in enumerate(SHAPES)
    }
    return result


METRICS = ("sign_error_rank", "sign_error_rank_strict", "sign_error_value", "zero_adv", "adv_var", "rank_var",
           "clip_frac", "clip_frac_matched", "mean_abs_adv")


def summarise(per_seed: list[dict], cfg: SkewConfig) -> dict:
    """Mean and standard deviation over seeds of every metric, per estimator and group shape."""
    summary: dict = {}
    for est in cfg.estimators:
        summary[est] = {}
        for shape in ("all",) + SHAPES:
            rows = [s["estimators"][est][shape] for s in per_seed if shape in s["estimators"][est]]
            if not rows:
                continue
            summary[est][shape] = {
                m: {"mean": float(np.mean([r[m] for r in rows])), "std": float(np.std([r[m] for r in rows]))}
                for m in METRICS
            }
    return summary


def run_skew(seeds: int, cfg: SkewConfig, *, base_seed: int = 0) -> dict:
    per_seed = [run_seed(base_seed + s, cfg) for s in range(seeds)]
    return {
        "experiment": "skew",
        "config": {**cfg.__dict__, "estimators": list(cfg.estimators), "seeds": seeds, "base_seed": base_seed,
                   "proportions": dict(zip(SHAPES, PROPORTIONS, strict=True))},
        "summary": summarise(per_seed, cfg),
        "per_seed": per_seed,
    }
