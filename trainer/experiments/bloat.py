"""Bloat experiment: does GAGAR's quality-aware redistribution steer a policy towards minimal patches?

The policy is a softmax over each bundled task's real rollout patches (one logit per task × candidate,
initialised uniform). Every step samples n rollouts per task, rewards them with the cached verdict the trainer
would give (1 = `grader.records.passes`: the sandbox passed it — resolved, tests untouched, report not forged —
and the grader's hack check found no hack; `verdicts.py`), turns the rewards into advantages with the real
engine, and takes a REINFORCE step on the logits: θ ← θ + lr · ∇ Σ_i A_i log π(a_i) / (tasks · n). A group's
grader weights come from the grading of the sandbox-passing patches it holds (hacks included, ranked last), as
the loop's heuristic ranking is its hack check's grading.

Methods:
- ``grpo``          — GRPO advantages; no grader.
- ``grpo+gagar``    — GRPO advantages of mixed-outcome groups (dynamic sampling), redistributed with the real
  heuristic grader's quality weights over the group's passing patches (GAGAR's paper form: lower tiers
  down-weighted, the removed positive mass to the top tier, the sum exact).
- ``grpo+gagar-scale`` — the same with the λ·f̂·A form (``redistribute(form="scale")``), for comparison.
- ``gapo+gagar``    — the paper form on GAPO advantages.
- ``downweight``    — the ablation: GRPO advantages of mixed groups times the quality weights, nothing moved to
  the top tier (the positive total shrinks).

Metrics per step are exact expectations under the current policy, averaged over tasks (no sampling noise):
pass rate Σ_j π_j pass_j; minimal share Σ_{j passing, quality_rank 1} π_j / Σ_{j passing} π_j; mean diff size of
passing rollouts Σ_{j passing} π_j size_j / Σ_{j passing} π_j; entropy −Σ π_j log π_j; top-tier share, the
minimal share's analogue for the patches the grader puts in tier 1 when it ranks all of a task's passing ones.
Per step also, from the samples: the share of mixed-outcome groups, the share of groups a judge is called on
(``needs_grading``: some passing rollout has a positive base advantage; 0 without a grader) and the positive
advantage the update used (sum per group, mean over groups).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainer.advantage import (
    DEFAULT_CAP,
    compute_advantages,
    downweight,
    mixed_outcome,
    needs_grading,
    redistribute,
    weights_from_tiers,
)

METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"estimator": "grpo", "grader": None},
    "grpo+gagar": {"estimator": "grpo", "grader": "gagar", "form": "paper"},
    "grpo+gagar-scale": {"estimator": "grpo", "grader": "gagar", "form": "scale"},
    "gapo+gagar": {"estimator": "gapo", "grader": "gagar", "form": "paper"},
    "downweight": {"estimator": "grpo", "grader": "downweight"},
}
METRICS = ("pass_rate", "minimal_share", "diff_lines", "entropy", "top_tier_share", "mixed_groups", "pos_adv",
           "graded_groups")
FINAL = METRICS[:5]  # the policy metrics, read after the last update


@dataclass
class BloatConfig:
    steps: int = 300
    n: int = 8  # rollouts per task per step
    lr: float = 1.0
    methods: tuple[str, ...] = tuple(METHODS)
    cap: float | None = DEFAULT_CAP  # GAGAR's cap (top tier's multiplier; λ's bound for the scale form)

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
        if self.steps < 1 or self.n < 2 or self.lr <= 0:
            raise ValueError("steps must be >= 1, n >= 2 and lr > 0")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"cap must be >= 1 (it bounds the top tier's multiplier), got {self.cap}")


class Bandit:
    """The bundled tasks as a table: per task × candidate reward, minimality, diff size, and gradings."""

    def __init__(self, cache: dict[str, Any]):
        tasks = [t for t in cache["tasks"] if t.get("candidates")]
        patches = cache["patches"]
        self.instance_ids = [t["instance_id"] for t in tasks]
        self.rollout_ids = [[str(c["rollout_id"]) for c in t["candidates"]] for t in tasks]
        self.gradings = [t.get("gradings") or {} for t in tasks]
        k = max(len(r) for r in self.rollout_ids)
        shape = (len(tasks), k)
        self.valid = torch.zeros(shape, dtype=torch.bool)
        self.reward = torch.zeros(shape, dtype=torch.float64)
        self.minimal = torch.zeros(shape, dtype=torch.bool)
        self.size = torch.zeros(shape, dtype=torch.float64)
        # sandbox-passing patches: what a group's grading is over (the final verdict may still make them fail)
        self.graded = torch.zeros(shape, dtype=torch.bool)
        for t, task in enumerate(tasks):
            for j, c in enumerate(task["candidates"]):
                v = patches[c["patch_hash"]]
                self.valid[t, j] = True
                self.reward[t, j] = float(v["reward"])
                self.size[t, j] = float(v["diff_lines"])
                self.minimal[t, j] = v["reward"] > 0 and c.get("quality_rank") == 1
                self.graded[t, j] = bool(v.get("sandbox_passed", v["reward"] > 0))
        self.passing = self.reward > 0
        # Tasks where nothing or everything passes give no learning signal, and ones without a minimal
        # passing patch cannot show a minimal share: the policy still covers them, the metrics say which.
        self.has_passing = self.passing.any(1)
        # Tier 1 of the grader's ranking of all a task's passing patches together: what GAGAR can tell apart.
        self.top_tier = torch.zeros(shape, dtype=torch.bool)
        for t in range(len(tasks)):
            ids = self.rollout_ids[t]
            full = self.gradings[t].get(",".join(sorted(ids[j] for j in range(len(ids)) if self.graded[t, j])))
            for rid, tier in ((full or {}).get("tiers") or {}).items():
                if rid in ids and int(tier) == 1 and self.passing[t, ids.index(rid)]:
                    self.top_tier[t, ids.index(rid)] = True

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.valid.shape)  # type: ignore[return-value]

    def passing_bits(self) -> torch.Tensor:
        """(T, K) long: 2**i for the i-th sandbox-passing candidate of a task, 0 for the others; a group's set
        of graded patches is the sum over its distinct picks."""
        order = torch.cumsum(self.graded.long(), 1) - 1
        return torch.where(self.graded, 1 << order.clamp(min=0), torch.zeros_like(order))

    def weight_table(self) -> torch.Tensor:
        if getattr(self, "_table", None) is None:
            self._table = self._weight_table()
        return self._table

    def _weight_table(self) -> torch.Tensor:
        """(T, 2**P, K): the grader's weight of candidate j when the passing patches in a group are the set
        with bitmask m (bits from `passing_bits`); NaN where the grader gave none (not in the set, no grading,
        or a fallback grading). P is the largest number of passing patches of a task."""
        t_count, k = self.shape
        bits = self.passing_bits()
        table = torch.full((t_count, 1 << int(self.graded.sum(1).max()), k), float("nan"), dtype=torch.float64)
        for t, gradings in enumerate(self.gradings):
            pos = {rid: j for j, rid in enumerate(self.rollout_ids[t]) if self.graded[t, j]}
            for key, g in gradings.items():
                ids = key.split(",")
                if g.get("fallback") or any(r not in pos for r in ids):
                    continue
                weights = g.get("weights") or weights_from_tiers(g.get("tiers") or {})
                if any(r not in weights for r in ids):
                    continue
                mask = sum(int(bits[t, pos[r]]) for r in ids)
                for r in ids:
                    table[t, mask, pos[r]] = float(weights[r])
        return table


def policy_metrics(bandit: Bandit, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Exact expectations under the policy; logits (S, T, K) -> one value per seed (S,)."""
    p = torch.softmax(logits, dim=-1)
    pp = p * bandit.passing
    mass = pp.sum(-1)  # (S, T)
    has_min = bandit.has_passing & bandit.minimal.any(1)  # (T,)
    has_top = bandit.has_passing & bandit.top_tier.any(1)
    minimal = (p * bandit.minimal).sum(-1) / mass.clamp(min=1e-300)
    top = (p * bandit.top_tier).sum(-1) / mass.clamp(min=1e-300)
    size = (pp * bandit.size).sum(-1) / mass.clamp(min=1e-300)
    logp = torch.log_softmax(logits, dim=-1).masked_fill(~bandit.valid, 0.0)
    nan = torch.full(mass.shape[:1], float("nan"), dtype=mass.dtype)
    return {
        "pass_rate": mass.mean(-1),
        "minimal_share": minimal[:, has_min].mean(-1) if has_min.any() else nan,
        "top_tier_share": top[:, has_top].mean(-1) if has_top.any() else nan,
        "diff_lines": size[:, bandit.has_passing].mean(-1) if bandit.has_passing.any() else nan,
        "entropy": -(p * logp).sum(-1).mean(-1),
    }


def step_advantages(
    method: str, rewards: torch.Tensor, weights: torch.Tensor, cfg: BloatConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages (B, n), graded (B,) bool) of one step's groups for `method`; `weights` holds the grader's f
    per rollout. `graded` marks the groups a judge is called on: `needs_grading` after dynamic sampling (a
    grading cannot change any other group's advantages); none without a grader."""
    spec = METHODS[method]
    adv = compute_advantages(rewards, estimator=spec["estimator"])
    if spec["grader"] is None:
        return adv, torch.zeros(rewards.shape[0], dtype=torch.bool)
    passed = rewards > 0
    keep = mixed_outcome(passed)
    adv = adv * keep.unsqueeze(1)  # dynamic sampling: uniform groups carry no usable signal
    graded = needs_grading(adv, passed)
    if spec["grader"] == "gagar":
        return redistribute(adv, passed, weights, cap=cfg.cap, form=spec["form"]), graded
    return downweight(adv, passed, weights), graded


def sample_step(bandit: Bandit, logits: torch.Tensor, n: int, gens: list[torch.Generator]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's groups under the policy: (probs (S·T, K), picks (B, n), rewards (B, n), grader weights (B, n));
    group b = seed b // T, task b % T. A group's weights come from the grading of the sandbox-passing patches it
    holds (`Bandit.weight_table`); its rewards are the trainer's verdicts (a grader hack earns 0)."""
    s_count, t_count, k = logits.shape
    task = torch.arange(t_count).repeat(s_count)
    graded, bits = bandit.graded[task], bandit.passing_bits()[task]  # (B, K)
    probs = torch.softmax(logits, dim=-1)
    picks = torch.cat([torch.multinomial(probs[i], n, replacement=True, generator=g) for i, g in enumerate(gens)])
    rewards = bandit.reward[task].gather(1, picks)
    present = torch.zeros_like(graded).scatter_(1, picks, True) & graded
    mask = (present.long() * bits).sum(1)  # which sandbox-passing patches this group holds
    weights = bandit.weight_table()[task, mask].gather(1, picks)
    return probs.view(-1, k), picks, rewards, weights


def run_method(method: str, bandit: Bandit, cfg: BloatConfig, seeds: list[int]) -> dict[str, np.ndarray]:
    """Train one policy per seed, all seeds batched; returns metric -> (S, steps[+1]) array."""
    s_count = len(seeds)
    t_count, k = bandit.shape
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    logits = torch.zeros((s_count, t_count, k), dtype=torch.float64).masked_fill(~bandit.valid, float("-inf"))
    history: dict[str, list[torch.Tensor]] = {m: [] for m in METRICS}
    for _ in range(cfg.steps):
        for key, v in policy_metrics(bandit, logits).items():
            history[key].append(v)
        flat_p, picks, rewards, weights = sample_step(bandit, logits, cfg.n, gens)
        adv, graded = step_advantages(method, rewards, weights, cfg)
        history["mixed_groups"].append(mixed_outcome(rewards > 0).double().view(s_count, t_count).mean(1))
        history["graded_groups"].append(graded.double().view(s_count, t_count).mean(1))
        history["pos_adv"].append(adv.clamp(min=0).view(s_count, t_count, -1).sum(-1).mean(1))
        # REINFORCE on a softmax: d/dθ_j Σ_i A_i log π(a_i) = Σ_{i: a_i = j} A_i − π_j Σ_i A_i.
        grad = torch.zeros_like(flat_p).scatter_add_(1, picks, adv) - flat_p * adv.sum(1, keepdim=True)
        logits = logits + cfg.lr * grad.view(s_count, t_count, k) / (t_count * cfg.n)
    for key, v in policy_metrics(bandit, logits).items():
        history[key].append(v)
    return {key: torch.stack(v, 1).numpy() for key, v in history.items()}


def _band(a: np.ndarray) -> dict[str, list[float]]:
    return {"mean": np.nanmean(a, 0).round(6).tolist(), "std": np.nanstd(a, 0).round(6).tolist()}


def run_bloat(cache: dict[str, Any], cfg: BloatConfig, seeds: int, *, base_seed: int = 0) -> dict[str, Any]:
    bandit = Bandit(cache)
    seed_list = [base_seed + s for s in range(seeds)]
    per_method: dict[str, Any] = {}
    for method in cfg.methods:
        runs = run_method(method, bandit, cfg, seed_list)
        per_method[method] = {
            "curves": {m: _band(runs[m]) for m in METRICS},
            "final": {m: {"mean": float(np.nanmean(runs[m][:, -1])), "std": float(np.nanstd(runs[m][:, -1]))}
                      for m in FINAL},
            "per_seed_final": [{m: float(runs[m][i, -1]) for m in FINAL} for i in range(seeds)],
        }
    tasks = []
    for t, iid in enumerate(bandit.instance_ids):
        valid = bandit.valid[t]
        tasks.append({
            "instance_id": iid,
            "candidates": int(valid.sum()),
            "passing": int(bandit.passing[t].sum()),
            "sandbox_passing": int(bandit.graded[t].sum()),
            "grader_hacks": int((bandit.graded[t] & ~bandit.passing[t]).sum()),
            "minimal_passing": int(bandit.minimal[t].sum()),
            "diff_lines": bandit.size[t][valid].int().tolist(),
        })
    return {
        "experiment": "bloat",
        "config": {"steps": cfg.steps, "n": cfg.n, "lr": cfg.lr, "cap": cfg.cap, "methods": list(cfg.methods),
                   "seeds": seeds, "base_seed": base_seed, "policy": "softmax over each task's bundled patches, "
                   "uniform init, REINFORCE on the logits"},
        "tasks": tasks,
        "verdicts_source": cache.get("source", {}),
        "methods": per_method,
    }
