"""verl plugin: the ``gapo`` and ``gagar`` advantage estimators for verl's registry (verl 0.9.1).

    from trainer.integrations import verl_plugin
    verl_plugin.register()            # before verl builds its trainer (e.g. in your main / a Ray runtime hook)

then run verl with ``algorithm.adv_estimator=gapo`` (or ``gagar``). Options are read from verl's algorithm config:
    +algorithm.gapo.coverage=0.5  +algorithm.gapo.center=median|mean  +algorithm.gapo.norm=true
    +algorithm.gapo.eps=1e-6      +algorithm.gagar.cap=3.0            +algorithm.gagar.base=grpo|dr_grpo|rloo|gapo
    +algorithm.gagar.form=paper|scale  +algorithm.gagar.tasks_dir=DIR
    +algorithm.gagar.judge=heuristic|llm (+ .model, .backend, .base_url, .adapter, .permutations: the grader's keys)
(``norm`` defaults to verl's own ``norm_adv_by_std_in_grpo``).

``gagar`` needs, per rollout, whether it passed (``gagar_passed``: ``EvalResult.passed`` from the sandbox
reward), its grader weight (``gagar_weight``: f in (0, 1], NaN = not graded) and optionally ``gagar_hacked``.
verl keeps such per-rollout fields in ``non_tensor_batch``, but its ``compute_advantage`` forwards that only to its
own GDPO estimator; a custom estimator gets token rewards, mask, uids and config. So the columns reach ``gagar``
either as the ``non_tensor_batch=`` argument or through ``batch_columns`` — the context that
``trainer.integrations.verl_trainer`` opens around verl's own dispatch (``GagarRayPPOTrainer``). When neither
carries the columns, ``gagar`` raises: silently falling back to the base estimator is how the weights got lost.
verl is imported only inside ``register``, so importing this module never needs verl.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trainer.advantage import ESTIMATORS, FORMS, compute_advantages, gagar_advantages

GAPO_DEFAULTS = {"coverage": 0.5, "center": "median", "eps": 1e-6}
# The grader's own keys (trainer.config.GraderSection): the same judge the native trainer builds.
GRADER_KEYS = ("judge", "model", "adapter", "backend", "base_url", "permutations")
# base grpo: the sandbox reward is pass/fail, and GRPO keeps every passing advantage of a mixed group positive,
# so GAGAR has something to move (GAPO's centre is 1 once most of a group passes) — the native trainer's default
GAGAR_DEFAULTS = {"cap": 3.0, "form": "paper", "base": "grpo", "tasks_dir": None,
                  **dict.fromkeys(GRADER_KEYS), "judge": "heuristic",
                  "weight_key": "gagar_weight", "passed_key": "gagar_passed", "hacked_key": "gagar_hacked"}

# The batch's non_tensor_batch while verl's dispatch runs (set by verl_trainer.compute_advantage).
_COLUMNS: ContextVar[Mapping[str, Any] | None] = ContextVar("gagar_verl_columns", default=None)


@contextlib.contextmanager
def batch_columns(non_tensor_batch: Mapping[str, Any]) -> Iterator[None]:
    """Make ``non_tensor_batch`` visible to the ``gagar`` estimator for the duration (same thread/task)."""
    token = _COLUMNS.set(non_tensor_batch)
    try:
        yield
    finally:
        _COLUMNS.reset(token)


def _section(config: Any, name: str, defaults: dict) -> dict:
    """Merge ``config.<name>`` (DictConfig, dict or missing) over the defaults; reject unknown keys."""
    raw = config.get(name, None) if config is not None else None
    given = dict(raw.items()) if raw is not None else {}
    unknown = set(given) - set(defaults) - {"norm"}
    if unknown:
        raise ValueError(f"unknown algorithm.{name} option(s) {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **given}


def gagar_options(config: Any) -> dict:
    """The ``algorithm.gagar`` section merged over GAGAR_DEFAULTS, with ``base`` checked."""
    opts = _section(config, "gagar", GAGAR_DEFAULTS)
    if opts["base"] not in ESTIMATORS:
        raise ValueError(f"algorithm.gagar.base={opts['base']!r} is not an estimator; known: {sorted(ESTIMATORS)}")
    if opts["form"] not in FORMS:
        raise ValueError(f"algorithm.gagar.form={opts['form']!r}; choose one of {', '.join(FORMS)}")
    return opts


def base_params(config: Any, base: str) -> dict:
    """Keyword arguments for the base estimator: the gapo section for ``gapo``; ``norm`` for ``grpo``."""
    opts = _section(config, "gapo", GAPO_DEFAULTS)
    norm = opts.pop("norm", None)
    if norm is None:
        norm = config.get("norm_adv_by_std_in_grpo", True) if config is not None else True
    if base == "gapo":
        return {"coverage": float(opts["coverage"]), "center": str(opts["center"]), "eps": float(opts["eps"]),
                "norm": bool(norm)}
    return {"norm": bool(norm)} if base == "grpo" else {}


def _index(index: Any) -> Any:
    if index is None:
        raise ValueError("verl passed no 'uid' index: GAPO/GAGAR need the group of each rollout")
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
        adv = compute_advantages(scores, estimator="gapo", index=_index(index), **base_params(config, "gapo"))
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def _column(extra: Mapping[str, Any], key: str, n: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    values = np.asarray(extra[key])
    if values.shape != (n,):
        raise ValueError(f"gagar: column {key!r} has shape {values.shape}, the batch has {n} rollouts")
    return torch.as_tensor(values.astype(np.float64), device=device).to(dtype)


def compute_gagar_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any = None,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """verl estimator: base advantages (``algorithm.gagar.base``, GRPO by default), hacks reset to failure,
    GAGAR redistribution by the grader weights in the ``gagar_weight`` column (see the module docstring)."""
    opts = gagar_options(config)
    extra = non_tensor_batch if non_tensor_batch is not None else _COLUMNS.get()
    missing = [opts[k] for k in ("weight_key", "passed_key") if extra is None or opts[k] not in extra]
    if missing:
        raise ValueError(
            f"gagar: column(s) {missing} did not reach the estimator. verl 0.9.1's compute_advantage forwards "
            "non_tensor_batch only to GDPO: train with trainer.integrations.verl_trainer.GagarRayPPOTrainer "
            "(recipes/verl/main.py does), whose dispatch passes the reward's gagar_* columns and grades the "
            "groups; or use adv_estimator=gapo for no grader")
    scores = token_level_rewards.sum(dim=-1)
    n, dev = scores.shape[0], scores.device
    passed = _column(extra, opts["passed_key"], n, dev, torch.bool)
    weights = _column(extra, opts["weight_key"], n, dev, torch.float32)
    hacked = _column(extra, opts["hacked_key"], n, dev, torch.bool) if opts["hacked_key"] in extra else None
    with torch.no_grad():
        adv = gagar_advantages(scores, passed, weights, index=_index(index), hacked=hacked, estimator=opts["base"],
                               cap=None if opts["cap"] is None else float(opts["cap"]), form=str(opts["form"]),
                               **base_params(config, opts["base"]))
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def register() -> None:
    """Register ``gapo`` and ``gagar`` with ``verl.trainer.ppo.core_algos.register_adv_est`` (idempotent)."""
    from verl.trainer.ppo import core_algos

    for name, fn in (("gapo", compute_gapo_advantage), ("gagar", compute_gagar_advantage)):
        if core_algos.ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            core_algos.ADV_ESTIMATOR_REGISTRY.pop(name, None)  # a reload of this module re-registers cleanly
            core_algos.register_adv_est(name)(fn)
