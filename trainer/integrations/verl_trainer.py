"""verl 0.9.1 trainer side of GAGAR: grade the groups that need it and hand the weights to verl's own dispatch.

verl's ``compute_advantage`` (verl/trainer/ppo/ray_trainer.py) is the one dispatch every estimator goes through:
it calls a registered estimator with ``token_level_rewards``, ``response_mask``, ``config``, ``index`` (uids) and
``reward_baselines`` — ``non_tensor_batch``, where the reward's per-rollout fields land, goes only to GDPO.
``RayPPOTrainer.fit`` calls that module-level function right after merging the reward's extra fields into
``non_tensor_batch``, with no method in between to override. So:

- ``compute_advantage`` here has verl's signature: for ``gagar`` it first grades the batch (``grade_batch``:
  the groups where ``needs_grading`` says a judge call can change an advantage; adds the ``gagar_weight``
  column and the judge's hack verdicts), then calls *verl's* ``compute_advantage`` with ``non_tensor_batch``
  made visible to the estimator (``verl_plugin.batch_columns``).
- ``GagarRayPPOTrainer`` is a ``RayPPOTrainer`` whose ``fit`` runs verl's own loop with the name ``fit`` looks up
  (``ray_trainer.compute_advantage``) bound to the function above, and restored afterwards.
- ``GagarTaskRunner`` is verl's legacy ``TaskRunner`` building a ``GagarRayPPOTrainer``; ``run`` starts it
  (recipes/verl/main.py). verl's v1 trainer (``trainer.use_v1=true``) fetches a fixed list of fields for the
  advantage, so the reward's columns never reach it: ``run`` requires ``trainer.use_v1=false``.

The batch needs, from the reward (recipes/verl/reward.py): ``gagar_passed`` (``EvalResult.passed``),
``gagar_hacked``, ``gagar_patch`` (the diff that was evaluated) and ``gagar_instance`` (its instance id).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer import main_ppo_v0
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from trainer.advantage import apply_hack_verdicts, compute_advantages, needs_grading
from trainer.integrations import verl_plugin

# verl's own dispatch, taken before anything rebinds the module attribute
VERL_COMPUTE_ADVANTAGE = ray_trainer.compute_advantage
REWARD_COLUMNS = ("gagar_patch", "gagar_instance")


def _groups_to_grade(data: DataProto, config: Any, opts: dict) -> tuple[list[Any], np.ndarray]:
    """Grader groups (rollout id = row number) for the batch's groups that need grading, and the hacked mask."""
    from grader.records import Candidate, Group
    from sandbox.inputs import load_instances

    nt = data.non_tensor_batch
    missing = [k for k in (opts["passed_key"], *REWARD_COLUMNS) if k not in nt]
    if missing:
        raise ValueError(f"gagar: the batch has no {missing} column(s): use recipes/verl/reward.py's compute_score "
                         "(or a reward returning the same fields) so the trainer can grade the passing patches")
    uid = np.asarray(nt["uid"])
    hacked = np.asarray(nt.get(opts["hacked_key"], np.zeros(len(uid))), dtype=bool)
    scores = data.batch["token_level_rewards"].sum(-1)
    rewards, passed = apply_hack_verdicts(scores, torch.as_tensor(np.asarray(nt[opts["passed_key"]], dtype=bool)),
                                          torch.as_tensor(hacked))
    adv = compute_advantages(rewards, estimator=opts["base"], index=uid,
                             **verl_plugin.base_params(config, opts["base"]))
    need = needs_grading(adv, passed, uid, per_rollout=True).numpy()
    tasks_dir = Path(opts["tasks_dir"] or ".gagar/tasks")
    notes: list[str] = []
    instances = load_instances(tasks_dir / "instances.jsonl", notes)
    groups = []
    for group_uid in dict.fromkeys(uid[need].tolist()):  # first-seen order
        rows = np.flatnonzero((uid == group_uid) & passed.numpy())
        iid = str(nt["gagar_instance"][rows[0]])
        if iid not in instances:
            raise ValueError(f"gagar: instance {iid!r} is not in {tasks_dir / 'instances.jsonl'} (set "
                             "algorithm.gagar.tasks_dir to the tasks dir the reward uses)")
        groups.append(Group.of_instance(instances[iid], [Candidate(str(r), str(nt["gagar_patch"][r])) for r in rows]))
    return groups, hacked


def grade_batch(data: DataProto, config: Any) -> dict[str, float]:
    """Grade the passing rollouts of the groups that need it; add ``gagar_weight`` (NaN: not graded) and merge
    the judge's hack verdicts into ``gagar_hacked``. Returns counts for the step's metrics."""
    from grader.grade import grade_groups

    opts = verl_plugin.gagar_options(config)
    groups, hacked = _groups_to_grade(data, config, opts)
    weights = np.full(len(hacked), math.nan)
    hacked = hacked.copy()
    usable = 0
    if groups:
        tasks_dir = Path(opts["tasks_dir"] or ".gagar/tasks")
        for g in grade_groups(groups, tasks_dir / "repos", judge=str(opts["judge"])):
            for rid in g.hacks:
                hacked[int(rid)] = True
            if not g.fallback:  # a fallback ranking is the heuristic's guess: the group stays unchanged
                usable += 1
                for rid, w in g.weights.items():
                    weights[int(rid)] = float(w)
    data.non_tensor_batch[opts["weight_key"]] = weights
    data.non_tensor_batch[opts["hacked_key"]] = hacked
    return {"gagar/graded_groups": float(len(groups)), "gagar/usable_gradings": float(usable),
            "gagar/judge_hacks": float(hacked.sum())}


def compute_advantage(data: DataProto, adv_estimator: Any, *args: Any, **kwargs: Any) -> DataProto:
    """verl's ``compute_advantage`` (same signature), with the batch graded first for ``gagar`` and its
    ``non_tensor_batch`` visible to the estimator."""
    if str(getattr(adv_estimator, "value", adv_estimator)) == "gagar":
        config = kwargs.get("config")
        if verl_plugin.gagar_options(config)["weight_key"] not in data.non_tensor_batch:
            grade_batch(data, config)
    with verl_plugin.batch_columns(data.non_tensor_batch):
        return VERL_COMPUTE_ADVANTAGE(data, adv_estimator, *args, **kwargs)


@contextlib.contextmanager
def _bound(module: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def gagar_dispatch() -> contextlib.AbstractContextManager[None]:
    """While open, verl's trainer loop (which calls ``ray_trainer.compute_advantage`` by module attribute)
    goes through ``compute_advantage`` above."""
    return _bound(ray_trainer, "compute_advantage", compute_advantage)


class GagarRayPPOTrainer(RayPPOTrainer):
    """verl's ``RayPPOTrainer`` whose advantage step grades the batch and forwards the ``gagar_*`` columns."""

    def init_workers(self) -> None:
        verl_plugin.register()  # this process computes the advantages: the estimators must be registered here
        super().init_workers()

    def fit(self) -> None:
        with gagar_dispatch():
            super().fit()


class GagarTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):  # the plain class under verl's @ray.remote
    """verl's legacy TaskRunner, building a ``GagarRayPPOTrainer`` instead of a ``RayPPOTrainer``."""

    def run(self, config: Any) -> None:
        if config.trainer.get("use_v1", False):
            raise ValueError("GAGAR needs verl's RayPPOTrainer: set trainer.use_v1=false (the v1 trainer fetches "
                             "a fixed field list for the advantage, so the reward's gagar_* columns never reach it)")
        with _bound(main_ppo_v0, "RayPPOTrainer", GagarRayPPOTrainer):
            super().run(config)


def run(config: Any) -> None:
    """verl's ``main_ppo.main`` for an already composed config, with ``GagarTaskRunner``."""
    import ray
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    if config.trainer.get("use_v1", False):
        raise ValueError("GAGAR needs verl's RayPPOTrainer: set trainer.use_v1=false")
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))
    run_ppo(config, task_runner_class=ray.remote(GagarTaskRunner))
