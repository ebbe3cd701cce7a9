"""TRL 1.16 ``GRPOTrainer`` with this package's advantages: GRPO + GAGAR by default, like the native trainer.

TRL has no advantage hook. Its ``_generate_and_score_completions`` gathers every process's rewards
(``_calculate_rewards`` returns the gathered (N_all, n_funcs) tensor), normalises them per group of
``num_generations`` consecutive completions, then keeps this process's slice. Group statistics need the whole
group, so this subclass captures the gathered rewards in ``_calculate_rewards``, computes our advantages on them,
and only then takes the same per-process slice, replacing ``output["advantages"]`` (and the logged copy).
TRL's ``scale_rewards`` is not used: normalisation is the estimator's (``advantage_params={"norm": False}``...).
Unscorable completions (every reward function returned None) are left out of their group, which is then ragged,
and get advantage 0, as in TRL.

GAGAR: pass ``quality_fn(inputs, completions, rewards) -> dict`` returning ``passed`` (bool), ``weights``
(f ∈ (0, 1], NaN = ungraded) and optionally ``hacked`` (bool), each (N_all,). A group of ``num_generations``
completions can span processes, and a judge must see the whole group, so ``quality_fn`` is called once, on the
main process, with the inputs, completions and rewards gathered from *all* processes (whole groups, in TRL's
order); its verdicts are broadcast to every process. Hacks are reset to failure before the base advantages, then
the advantages are redistributed (``gagar_form``, ``gagar_cap``). Without a ``quality_fn`` the base estimator's
advantages are used as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object
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
        advantage_estimator: str = "grpo",
        advantage_params: dict | None = None,
        quality_fn: QualityFn | None = None,
        gagar_cap: float | None = DEFAULT_CAP,
        gagar_form: str = "paper",
        failure_reward: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.advantage_estimator = advantage_estimator
        self.advantage_params = dict(advantage_params or {})
        self.quality_fn = quality_fn
        self.gagar_cap = gagar_cap
        self.gagar_form = gagar_form
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

    # Collective calls, one place (a test stands in for several processes here).
    def _gather_objects(self, items: list) -> list:
        return gather_object(list(items))

    def _broadcast(self, obj: Any) -> Any:
        box = [obj if self.accelerator.is_main_process else None]
        broadcast_object_list(box)
        return box[0]

    def _quality(self, captured: dict, rewards: Tensor) -> dict | None:
        """``quality_fn`` on the whole gathered batch (every group complete), run on the main process only."""
        if self.quality_fn is None:
            return None
        inputs = self._gather_objects(captured["inputs"])
        completions = self._gather_objects(captured["completions"])
        q = None
        if self.accelerator.is_main_process:
            q = self.quality_fn(inputs, completions, rewards.cpu())
            q = {k: torch.as_tensor(v).cpu() for k, v in q.items() if v is not None}
        q = self._broadcast(q)
        for key in ("passed", "weights", "hacked"):
            if key in q and q[key].shape != rewards.shape:
                raise ValueError(f"quality_fn returned {key} of shape {tuple(q[key].shape)}; the gathered batch has "
                                 f"{rewards.shape[0]} completions (one verdict per completion of all processes)")
        return q

    def _our_advantages(self, captured: dict) -> Tensor:
        rewards_per_func: Tensor = captured["rewards_per_func"]
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)
        mode = "train" if self.model.training else "eval"
        n = self.num_generations if mode == "train" else self.num_generations_eval
        group = torch.arange(rewards.shape[0], device=rewards.device) // n  # TRL lays groups out consecutively
        q = self._quality(captured, rewards)
        passed = weights_q = None
        if q is not None:
            device = rewards.device
            passed = q["passed"].to(device).bool()
            weights_q = q["weights"].to(device).float()
            if "hacked" in q:
                rewards, passed = apply_hack_verdicts(rewards, passed, q["hacked"].to(device).bool(),
                                                      failure_reward=self.failure_reward)
        out = torch.zeros_like(rewards)
        keep = scorable.nonzero(as_tuple=True)[0]
        if keep.numel():
            adv = compute_advantages(rewards[keep], estimator=self.advantage_estimator, index=group[keep],
                                     **self.advantage_params)
            if passed is not None:
                adv = redistribute(adv, passed[keep], weights_q[keep], index=group[keep], cap=self.gagar_cap,
                                   form=self.gagar_form)
            out[keep] = adv
        return out
