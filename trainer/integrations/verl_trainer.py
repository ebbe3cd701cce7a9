"""verl 0.9.1 trainer side of GAGAR: grade the groups that need it and hand the weights to verl's own dispatch.

verl's ``compute_advantage`` (verl/trainer/ppo/ray_trainer.py) is the one dispatch every estimator goes through:
it calls a registered estimator with ``token_level_rewards``, ``response_mask``, ``config``, ``index`` (uids) and
``reward_baselines`` — ``non_tensor_batch``, where the reward's per-rollout fields land, goes only to GDPO.
``RayPPOTrainer.fit`` calls that module-level function right after merging the reward's extra fields into
``non_tensor_batch``, with no method in between to override. So:

- ``compute_advantage`` here has verl's signature: for ``gagar`` it first grades the batch (``grade_batch``, the
  native trainer's check → rank: the hack check on every group with a pass, a judge only where
  ``needs_grading`` says a ranking can change an advantage; adds the ``gagar_weight`` column and the hack
  verdicts), applies dynamic sampling when ``algorithm.filter_groups.enable`` (``filter_groups``), then calls
  *verl's* ``compute_advantage`` with ``non_tensor_batch`` made visible to the estimator
  (``verl_plugin.batch_columns``).
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

from trainer.advantage import compute_advantages, mixed_outcome, needs_grading
from trainer.integrations import verl_plugin

# verl's own dispatch, taken before anything rebinds the module attribute
VERL_COMPUTE_ADVANTAGE = ray_trainer.compute_advantage
REWARD_COLUMNS = ("gagar_patch", "gagar_instance")
_JUDGES: dict[tuple, Any] = {}  # one Judge (and LLM backend) per grader configuration, kept across steps


def _judge(opts: dict, tasks_dir: Path) -> Any:
    from trainer.config import ConfigError, GraderSection
    from trainer.judging import Judge

    fields = {k: opts[k] for k in verl_plugin.GRADER_KEYS if opts.get(k) is not None}
    key = (str(tasks_dir), tuple(sorted(fields.items())))
    if key not in _JUDGES:
        try:
            section = GraderSection.model_validate(fields)
        except ValueError as exc:
            raise ConfigError(f"algorithm.gagar: {exc}") from exc
        _JUDGES[key] = Judge(section, tasks_dir / "repos")
    return _JUDGES[key]


def _groups(data: DataProto, passed: np.ndarray, tasks_dir: Path) -> tuple[list[Any], list[np.ndarray]]:
    """Grader groups (rollout id = row number) of the batch's uid groups that have a passing row, and their rows."""
    from grader.records import Candidate, Group
    from sandbox.inputs import load_instances

    nt = data.non_tensor_batch
    uid = np.asarray(nt["uid"])
    notes: list[str] = []
    instances = load_instances(tasks_dir / "instances.jsonl", notes)
    groups, rows_of = [], []
    for group_uid in dict.fromkeys(uid[passed].tolist()):  # first-seen order
        rows = np.flatnonzero((uid == group_uid) & passed)
        iid = str(nt["gagar_instance"][rows[0]])
        if iid not in instances:
            raise ValueError(f"gagar: instance {iid!r} is not in {tasks_dir / 'instances.jsonl'} (set "
                             "algorithm.gagar.tasks_dir to the tasks dir the reward uses)")
        groups.append(Group.of_instance(instances[iid], [Candidate(str(r), str(nt["gagar_patch"][r])) for r in rows]))
        rows_of.append(rows)
    return groups, rows_of


def grade_batch(data: DataProto, config: Any) -> dict[str, float]:
    """The native trainer's check → rank on a verl batch (`trainer.judging.Judge`, the same code):

    1. the model-free hack check on *every* uid group with a passing row (not gated by `needs_grading`);
       its hacks make those rows fail: `gagar_passed` False, `gagar_hacked` True, and their score is taken out
       of `token_level_scores` / `token_level_rewards`, so verl's reward metrics count them as the failures they
       are;
    2. base advantages on the final verdicts, then the configured judge on the groups `needs_grading` marks;
       its weights go to the `gagar_weight` column (NaN: not graded, or a fallback ranking).
    Returns counts for the step's metrics (also kept in `data.meta_info["gagar"]`)."""
    opts = verl_plugin.gagar_options(config)
    nt = data.non_tensor_batch
    missing = [k for k in (opts["passed_key"], *REWARD_COLUMNS) if k not in nt]
    if missing:
        raise ValueError(f"gagar: the batch has no {missing} column(s): use recipes/verl/reward.py's compute_score "
                         "(or a reward returning the same fields) so the trainer can grade the passing patches")
    tasks_dir = Path(opts["tasks_dir"] or ".gagar/tasks")
    judge = _judge(opts, tasks_dir)
    uid = np.asarray(nt["uid"])
    n = len(uid)
    hacked = np.asarray(nt.get(opts["hacked_key"], np.zeros(n)), dtype=bool).copy()
    passed = np.asarray(nt[opts["passed_key"]], dtype=bool) & ~hacked
    sandbox_passed = passed.copy()

    groups, rows_of = _groups(data, passed, tasks_dir)
    checks = judge.check(groups)
    for grading in checks:
        for rid in grading.hacks:
            hacked[int(rid)], passed[int(rid)] = True, False

    scores = data.batch["token_level_rewards"].sum(-1)
    rewards = torch.where(torch.as_tensor(hacked), torch.zeros_like(scores), scores)
    adv = compute_advantages(rewards, estimator=opts["base"], index=uid,
                             **verl_plugin.base_params(config, opts["base"]))
    need = needs_grading(adv, torch.as_tensor(passed), uid, per_rollout=True).numpy()
    todo = [i for i, rows in enumerate(rows_of) if need[rows[0]]]
    weights = np.full(n, math.nan)
    usable = 0
    for ranking in judge.rank([groups[i] for i in todo], [checks[i] for i in todo]):
        for rid in ranking.hacks:  # an LLM judge may find more (the heuristic's are the check's own)
            hacked[int(rid)], passed[int(rid)] = True, False
        if not ranking.fallback:  # a fallback ranking is the heuristic's guess: the group stays unchanged
            usable += 1
            for rid, w in ranking.weights.items():
                weights[int(rid)] = float(w)

    found = torch.as_tensor(hacked & sandbox_passed)  # hacks the sandbox had scored as passes
    keys = data.batch.keys()
    if "token_level_scores" in keys:  # rewards = scores (− β·KL when use_kl_in_reward): take the score out
        old = data.batch["token_level_scores"][found]
        data.batch["token_level_scores"][found] = 0.0
        if "token_level_rewards" in keys:
            data.batch["token_level_rewards"][found] -= old
    elif "token_level_rewards" in keys:
        data.batch["token_level_rewards"][found] = 0.0
    nt[opts["weight_key"]] = weights
    nt[opts["hacked_key"]] = hacked
    nt[opts["passed_key"]] = passed
    stats = {"gagar/checked_groups": float(len(groups)), "gagar/graded_groups": float(len(todo)),
             "gagar/usable_gradings": float(usable), "gagar/grader_hacks": float(found.sum())}
    data.meta_info.setdefault("gagar", {}).update(stats)
    return stats


def filter_groups(data: DataProto, config: Any) -> dict[str, float]:
    """DAPO's dynamic sampling (``algorithm.filter_groups.enable``) for verl's legacy loop: uid groups whose
    final verdicts are all equal carry no signal; their rows leave the loss (``response_mask`` zeroed, so they
    count in no token- or sequence-mean). The loop cannot draw more prompts at this point, so the step trains on
    fewer groups rather than refilling (verl's v1 trainer refills; it cannot carry the gagar columns)."""
    nt = data.non_tensor_batch
    uid = np.asarray(nt["uid"])
    key = verl_plugin.gagar_options(config)["passed_key"]
    if key in nt:
        keep = mixed_outcome(torch.as_tensor(np.asarray(nt[key], dtype=bool)), uid, per_rollout=True)
    else:  # no verdict column (another reward): a group carries signal when its scores differ
        from trainer.advantage.segment import segments

        scores = data.batch["token_level_rewards"].sum(-1)
        seg = segments(uid, len(uid), scores.device)
        dense = seg.to_dense(scores)
        real = torch.arange(seg.width, device=scores.device) < seg.sizes[:, None]
        lo = torch.where(real, dense, math.inf).amin(1)
        hi = torch.where(real, dense, -math.inf).amax(1)
        keep = (hi > lo)[seg.group]
    data.batch["response_mask"][~keep] = 0
    stats = {"gagar/filtered_rows": float((~keep).sum()), "gagar/kept_rows": float(keep.sum())}
    data.meta_info.setdefault("gagar", {}).update(stats)
    return stats


def compute_advantage(data: DataProto, adv_estimator: Any, *args: Any, **kwargs: Any) -> DataProto:
    """verl's ``compute_advantage`` (same signature), with the batch graded first for ``gagar`` and its
    ``non_tensor_batch`` visible to the estimator."""
    config = kwargs.get("config")
    if str(getattr(adv_estimator, "value", adv_estimator)) == "gagar":
        if verl_plugin.gagar_options(config)["weight_key"] not in data.non_tensor_batch:
            grade_batch(data, config)
    fg = config.get("filter_groups", None) if config is not None else None
    if fg is not None and fg.get("enable", False):
        filter_groups(data, config)
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
