"""TRL 1.16 ``GRPOTrainer`` with this package's advantages (GAPO by default, optional GAGAR).

TRL has no advantage hook. Its ``_generate_and_score_completions`` gathers every process's rewards
(``_calculate_rewards`` returns the gathered (N_all, n_funcs) tensor), normalises them per group of
``num_generations`` consecutive completions, then keeps this process's slice. Group statistics need the whole
group, so this subclass captures the gathered rewards in ``_calculate_rewards``, computes our advantages on them,
and only then takes the same per-process slice, replacing ``output["advantages"]`` (and the logged copy).
TRL's ``scale_rewards`` is not used: normalisation is the estimator's (``advantage_params={"norm": False}``...).
Unscorable completions (every reward function returned None) are left out of their group, which is then ragged,
and get advantage 0, as in TRL.

GAGAR: pass ``quality_fn(inputs, completions, rewards) -> dict`` returning, for this process's completions,
``passed`` (bool), ``weights`` (f ∈ (0, 1], NaN = ungraded) and optionally ``hacked`` (bool), each (n_local,).
They are gathered across processes, hacks are reset to failure, and the advantages redistributed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from trl import GRPOTrainer

from trainer.advantage import DEFAULT_CAP, compute_advantages, redistribute
from trainer.advantage.gagar import apply_hack_verdicts

QualityFn = Callable[[list, list, Tensor], dict]


class GagarGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages come from ``trainer.advantage`` (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        advantage_estimator: str = "gapo",
        advantage_params: dict | None = None,
        quality_fn: QualityFn | None = None,
        gagar_cap: float | None = DEFAULT_CAP,
        failure_reward: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.advantage_estimator = advantage_estimator
        self.advantage_params = dict(advantage_params or {})
        self.quality_fn = quality_fn
        self.gagar_cap = gagar_cap
        self.failure_reward = failure_reward
        self._captured: dict | None = None
        self.last_advantages: Tensor | None = None  # gathered, all processes: for logging and tests

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        gathered = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._captured = {"inputs": inputs, "completions": completions, "rewards_per_func": gathered}
        return gathered

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        captured, self._captured = self._captured, None
        if captured is None:
            raise RuntimeError("TRL did not call _calculate_rewards: this TRL version is not supported")
        advantages = self._our_advantages(captured)
        self.last_advantages = advantages
        n_local = len(inputs)
        start = self.accelerator.process_index * n_local
        local = advantages[start : start + n_local]
        output["advantages"] = local.to(output["advantages"].device, output["advantages"].dtype)
        logged = self._logs["advantages"]  # TRL logged its own (gathered) advantages last: replace them
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())
        return output

    def _our_advantages(self, captured: dict) -> Tensor:
        rewards_per_func: Tensor = captured["rewards_per_func"]
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)
        mode = "train" if self.model.training else "eval"
        n = self.num_generations if mode == "train" else self.num_generations_eval
        group = torch.arange(rewards.shape[0], device=rewards.device) // n  # TRL lays groups out consecutively
        passed = weights_q = None
        if self.quality_fn is not None:
            n_local = len(captured["inputs"])
            start = self.accelerator.process_index * n_local
            q = self.quality_fn(captured["inputs"], captured["completions"], rewards[start : start + n_local])
            device = rewards.device
            passed = self.accelerator.gather(torch.as_tensor(q["passed"], device=device).bool())
            weights_q = self.accelerator.gather(torch.as_tensor(q["weights"], device=device).float())
            if q.get("hacked") is not None:
                hacked = self.accelerator.gather(torch.as_tensor(q["hacked"], device=device).bool())
                rewards, passed = apply_hack_verdicts(rewards, passed, hacked, failure_reward=self.failure_reward)
        out = torch.zeros_like(rewards)
        keep = scorable.nonzero(as_tuple=True)[0]
        if keep.numel():
            adv = compute_advantages(rewards[keep], estimator=self.advantage_estimator, index=group[keep],
                                     **self.advantage_params)
            if passed is not None:
                adv = redistribute(adv, passed[keep], weights_q[keep], index=group[keep], cap=self.gagar_cap)
            out[keep] = adv
        return out
