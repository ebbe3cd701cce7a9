"""verl plugin: the ``gapo`` and ``gagar`` advantage estimators for verl's registry (verl 0.9.1).

    from trainer.integrations import verl_plugin
    verl_plugin.register()            # before verl builds its trainer (e.g. in your main / a Ray runtime hook)

then run verl with ``algorithm.adv_estimator=gapo`` (or ``gagar``). Options are read from verl's algorithm config:
    +algorithm.gapo.coverage=0.5  +algorithm.gapo.center=median|mean  +algorithm.gapo.norm=true
    +algorithm.gapo.eps=1e-6      +algorithm.gagar.cap=3.0            +algorithm.gagar.pass_threshold=0.5
(``norm`` defaults to verl's own ``norm_adv_by_std_in_grpo``). verl hands custom estimators only
``token_level_rewards``, ``response_mask``, ``index`` (uids) and ``config``; GAGAR also needs, per rollout,
whether it passed and its grader weight. ``gagar`` therefore reads them from ``non_tensor_batch`` (keys
``gagar_weight``: f ∈ (0, 1] or NaN, optional ``gagar_passed`` and ``gagar_hacked``; default: passed = score >
pass_threshold). verl 0.9.1's ``compute_advantage`` forwards ``non_tensor_batch`` only to its own GDPO, so a
trainer that wants grader weights calls ``compute_gagar_advantage(..., non_tensor_batch=data.non_tensor_batch)``
from its ``_compute_advantage`` override. Without weights every group counts as ungraded and ``gagar`` returns
GAPO's advantages (hacks still reset) — the documented fallback, never an error.
verl is imported only inside these functions, so importing this module never needs verl.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trainer.advantage import compute_advantages, gagar_advantages

GAPO_DEFAULTS = {"coverage": 0.5, "center": "median", "eps": 1e-6}
GAGAR_DEFAULTS = {"cap": 3.0, "pass_threshold": 0.5, "weight_key": "gagar_weight",
                  "passed_key": "gagar_passed", "hacked_key": "gagar_hacked"}


def _section(config: Any, name: str, defaults: dict) -> dict:
    """Merge ``config.<name>`` (DictConfig, dict or missing) over the defaults; reject unknown keys."""
    raw = config.get(name, None) if config is not None else None
    given = dict(raw.items()) if raw is not None else {}
    unknown = set(given) - set(defaults) - {"norm"}
    if unknown:
        raise ValueError(f"unknown algorithm.{name} option(s) {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **given}


def _gapo_params(config: Any) -> dict:
    opts = _section(config, "gapo", GAPO_DEFAULTS)
    norm = opts.pop("norm", None)
    if norm is None:
        norm = config.get("norm_adv_by_std_in_grpo", True) if config is not None else True
    return {"coverage": float(opts["coverage"]), "center": str(opts["center"]), "eps": float(opts["eps"]),
            "norm": bool(norm)}


def _index(index: Any) -> Any:
    if index is None:
        raise ValueError("verl passed no 'uid' index: GAPO needs the group of each rollout")
    return np.asarray(index)


def compute_gapo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, index: Any = None, config: Any = None, **_: Any
) -> tuple[Tensor, Tensor]:
    """verl estimator: outcome reward = Σ token rewards; GAPO per uid group; broadcast over response tokens.

    token_level_rewards, response_mask: (bs, response_length); index: (bs,) uids. Returns (advantages, returns),
    both (bs, response_length).
    """
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        adv = compute_advantages(scores, estimator="gapo", index=_index(index), **_gapo_params(config))
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def compute_gagar_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any = None,
    config: Any = None,
    non_tensor_batch: dict | None = None,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """verl estimator: GAPO, hacks reset to failure, then GAGAR redistribution by grader weights (see module)."""
    opts = _section(config, "gagar", GAGAR_DEFAULTS)
    scores = token_level_rewards.sum(dim=-1)
    extra = non_tensor_batch or {}
    n = scores.shape[0]

    def column(key: str, default: Any, dtype) -> Tensor:
        if key in extra:
            return torch.as_tensor(np.asarray(extra[key], dtype=np.float64), device=scores.device).to(dtype)
        return default

    passed = column(opts["passed_key"], scores > float(opts["pass_threshold"]), torch.bool)
    weights = column(opts["weight_key"], torch.full((n,), math.nan, device=scores.device), torch.float32)
    hacked = column(opts["hacked_key"], None, torch.bool)
    with torch.no_grad():
        adv = gagar_advantages(scores, passed, weights, index=_index(index), hacked=hacked,
                               cap=None if opts["cap"] is None else float(opts["cap"]), **_gapo_params(config))
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def register() -> None:
    """Register ``gapo`` and ``gagar`` with ``verl.trainer.ppo.core_algos.register_adv_est`` (idempotent)."""
    from verl.trainer.ppo import core_algos

    for name, fn in (("gapo", compute_gapo_advantage), ("gagar", compute_gagar_advantage)):
        if core_algos.ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            core_algos.ADV_ESTIMATOR_REGISTRY.pop(name, None)  # a reload of this module re-registers cleanly
            core_algos.register_adv_est(name)(fn)
