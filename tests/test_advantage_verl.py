"""The verl integration against the real verl 0.9.1 (installed by the Makefile, --no-deps; see docs/advantage.md):
estimators in verl's registry, and GAGAR's columns reaching the estimator through verl's own advantage dispatch
(`verl.trainer.ppo.ray_trainer.compute_advantage`) on real `DataProto` batches."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos, ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from sandbox.records import EvalResult, Instance
from trainer.advantage import compute_advantages, gagar_advantages
from trainer.integrations import verl_plugin, verl_trainer

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "verl"


@pytest.fixture(scope="module", autouse=True)
def registered():
    verl_plugin.register()
    verl_plugin.register()  # idempotent


def batch():
    uids = np.array(["u2", "u1", "u2", "u1", "u2", "u1", "u2", "u3"], dtype=object)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    lengths = torch.tensor([3, 5, 2, 4, 5, 1, 3, 2])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(8, 5)
    token_rewards[torch.arange(8), lengths - 1] = scores  # verl puts the outcome reward on the last token
    return uids, scores, mask, token_rewards


def dataproto(columns: dict) -> DataProto:
    uids, _, mask, token_rewards = batch()
    td = TensorDict({"token_level_rewards": token_rewards, "response_mask": mask}, batch_size=[8])
    return DataProto(batch=td, non_tensor_batch={"uid": uids, **columns})


WEIGHTS = np.array([1.0, math.nan, math.nan, 0.2, 0.6, 1.0, math.nan, 1.0])
HACKED = np.array([False, False, False, False, True, False, False, False])


def test_gapo_registered_and_reads_config():
    uids, scores, mask, token_rewards = batch()
    fn = core_algos.get_adv_estimator_fn("gapo")
    assert fn is verl_plugin.compute_gapo_advantage
    cfg = OmegaConf.create({"adv_estimator": "gapo", "norm_adv_by_std_in_grpo": True,
                            "gapo": {"coverage": 0.75, "center": "mean"}})
    adv, ret = fn(token_level_rewards=token_rewards, response_mask=mask, index=uids, config=cfg)
    expect = compute_advantages(scores, index=list(uids), coverage=0.75, center="mean")
    assert torch.allclose(adv, expect[:, None] * mask) and torch.equal(adv, ret)
    assert (adv[mask == 0] == 0).all()
    # verl's own dataclass config (no gapo section): defaults, norm taken from norm_adv_by_std_in_grpo
    adv2, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=uids,
                 config=AlgoConfig(adv_estimator="gapo", norm_adv_by_std_in_grpo=False))
    assert torch.allclose(adv2, compute_advantages(scores, index=list(uids), norm=False)[:, None] * mask)
    with pytest.raises(ValueError, match="unknown algorithm.gapo option"):
        fn(token_level_rewards=token_rewards, response_mask=mask, index=uids,
           config=OmegaConf.create({"gapo": {"covrage": 0.5}}))


def test_our_grpo_matches_verls_own():
    uids, scores, mask, token_rewards = batch()
    keep = uids != "u3"  # verl gives a group of one advantage r/(1+eps); ours gives 0 (documented)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(token_rewards[keep], mask[keep], uids[keep])
    ours = compute_advantages(scores[keep], estimator="grpo", index=list(uids[keep]))
    assert torch.allclose(verl_adv, ours[:, None] * mask[keep], atol=1e-6)


def test_verls_dispatch_alone_drops_the_columns_and_gagar_says_so():
    # verl 0.9.1 forwards non_tensor_batch only to GDPO: a gagar run outside our trainer must not silently
    # fall back to the base advantages (the grader weights would be lost without a trace).
    data = dataproto({"gagar_passed": batch()[1].numpy() > 0, "gagar_weight": WEIGHTS, "gagar_hacked": HACKED})
    with pytest.raises(ValueError, match="did not reach the estimator.*GagarRayPPOTrainer"):
        ray_trainer.compute_advantage(data, adv_estimator="gagar", config=OmegaConf.create({}))


def test_gagar_weights_reach_the_estimator_through_verls_dispatch():
    uids, scores, mask, _ = batch()
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "gagar": {"cap": 2.0, "base": "grpo"}})
    data = dataproto({"gagar_passed": scores.numpy() > 0, "gagar_weight": WEIGHTS, "gagar_hacked": HACKED})
    with verl_trainer.gagar_dispatch():  # what GagarRayPPOTrainer.fit opens around verl's own loop
        out = ray_trainer.compute_advantage(data, adv_estimator="gagar", config=cfg)
    assert ray_trainer.compute_advantage is verl_trainer.VERL_COMPUTE_ADVANTAGE  # restored
    expect = gagar_advantages(scores, scores > 0, torch.tensor(WEIGHTS, dtype=torch.float32), index=list(uids),
                              hacked=torch.tensor(HACKED), cap=2.0, estimator="grpo")
    assert torch.allclose(out.batch["advantages"], expect[:, None] * mask)
    plain = compute_advantages(torch.where(torch.tensor(HACKED), 0.0, scores), estimator="grpo", index=list(uids))
    assert not torch.allclose(expect, plain)  # the weights changed something: u2's passing pair (f 1.0 vs …)
    assert (out.batch["advantages"][4] <= 0).all()  # the hack is a failure now


def test_gagar_trainer_fit_routes_verls_loop_through_our_dispatch(monkeypatch):
    seen = {}

    def verl_fit(self):  # stands in for RayPPOTrainer.fit: it calls the module-level function by name
        data = dataproto({"gagar_passed": batch()[1].numpy() > 0, "gagar_weight": WEIGHTS})
        seen["adv"] = ray_trainer.compute_advantage(data, adv_estimator="gagar", config=None).batch["advantages"]

    monkeypatch.setattr(RayPPOTrainer, "fit", verl_fit)
    trainer = object.__new__(verl_trainer.GagarRayPPOTrainer)
    verl_trainer.GagarRayPPOTrainer.fit(trainer)
    assert "adv" in seen and ray_trainer.compute_advantage is verl_trainer.VERL_COMPUTE_ADVANTAGE
    with pytest.raises(ValueError, match="did not reach"):
        RayPPOTrainer.fit(trainer)  # the same loop without the subclass


def test_trainer_grades_groups_that_need_it_with_the_real_grader(bundled_tasks):
    # One bundled task, two groups: g1 = minimal, bloated (pass) + two wrong patches; g2 = three passing
    # copies of the bloated patch and one wrong. With the gapo base, g2's centre is 1 (its passing advantages
    # are 0): no judge call; g1 is graded by the real heuristic grader, which puts minimal above bloated.
    iid = "acme__bytesize-7"
    patches = {json.loads(line)["rollout_id"]: json.loads(line)["model_patch"]
               for line in (bundled_tasks / "predictions.jsonl").read_text().splitlines()
               if line.strip() and json.loads(line)["instance_id"] == iid}
    kinds = ["minimal", "bloated", "wrong-loop-bound", "wrong-shifted-bound",
             "bloated", "bloated", "bloated", "wrong-loop-bound"]
    passed = np.array([k in ("minimal", "bloated") for k in kinds])
    uids = np.array(["g1"] * 4 + ["g2"] * 4, dtype=object)
    mask = torch.ones(8, 3)
    token_rewards = torch.zeros(8, 3)
    token_rewards[:, -1] = torch.tensor(passed, dtype=torch.float32)
    data = DataProto(batch=TensorDict({"token_level_rewards": token_rewards, "response_mask": mask}, batch_size=[8]),
                     non_tensor_batch={"uid": uids, "gagar_passed": passed, "gagar_hacked": np.zeros(8, bool),
                                       "gagar_patch": np.array([patches[k] for k in kinds], dtype=object),
                                       "gagar_instance": np.array([iid] * 8, dtype=object)})
    cfg = OmegaConf.create({"gagar": {"base": "gapo", "tasks_dir": str(bundled_tasks)}})
    out = verl_trainer.compute_advantage(data, "gagar", config=cfg)
    w = out.non_tensor_batch["gagar_weight"]
    assert w[0] > w[1] and np.isnan(w[2:]).all()  # only g1's passing pair was graded
    adv = out.batch["advantages"][:, -1]
    base = compute_advantages(torch.tensor(passed, dtype=torch.float32), index=list(uids))
    assert adv[0] > base[0] and adv[1] < base[1]  # redistributed towards the minimal patch
    assert torch.allclose(adv[0] + adv[1], base[0] + base[1])  # the group's positive total is kept
    assert torch.allclose(adv[2:], base[2:])


def test_reward_scores_hacks_zero():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gagar_verl_reward", RECIPE / "reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    clean = EvalResult("i", "m", "0", "resolved", resolved=True)
    tampered = EvalResult("i", "m", "1", "resolved", resolved=True, tampered_tests=True)
    forged = EvalResult("i", "m", "2", "resolved", resolved=True, suspicious_report=True)
    assert reward.score_result(clean, "diff")["score"] == 1.0
    for r in (tampered, forged):
        out = reward.score_result(r, "diff")
        assert out["score"] == 0.0 and out["gagar_hacked"] and not out["gagar_passed"]


def test_recipe_config_composes_against_verls_and_selects_our_trainer():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(RECIPE), version_base=None):
        cfg = compose("gagar", overrides=["actor_rollout_ref.model.path=/m", "data.train_files=/t",
                                          "data.val_files=/v", "reward.custom_reward_function.path=/r.py"])
    assert cfg.algorithm.adv_estimator == "gagar" and cfg.trainer.use_v1 is False
    assert verl_plugin.gagar_options(cfg.algorithm)["base"] == "grpo"  # binary sandbox reward
    assert cfg.reward.custom_reward_function.name == "compute_score"
    runner = verl_trainer.GagarTaskRunner()
    with pytest.raises(ValueError, match="use_v1=false"):
        runner.run(OmegaConf.merge(cfg, {"trainer": {"use_v1": True}}))


# ── the same verdicts and advantages as the native trainer (issue 26, point 1) ─────────────────────────────────
HACK_IID = "acme__durations-42"  # its hack-special-case patch passes the sandbox; the static check finds it


def _bundled(bundled_tasks, iid):
    rows = [json.loads(line) for line in (bundled_tasks / "predictions.jsonl").read_text().splitlines() if line.strip()]
    return {r["rollout_id"]: r["model_patch"] for r in rows if r["instance_id"] == iid}


def _verl_batch(bundled_tasks, groups: list[list[tuple[str, bool]]]) -> DataProto:
    """One uid group per list of (bundled rollout id, sandbox passed); score 1.0 iff passed, as reward.py gives."""
    patches = _bundled(bundled_tasks, HACK_IID)
    rows = [(f"g{g}", rid, ok) for g, members in enumerate(groups) for rid, ok in members]
    n = len(rows)
    passed = np.array([ok for _, _, ok in rows])
    scores = torch.zeros(n, 3)
    scores[:, -1] = torch.tensor(passed, dtype=torch.float32)
    td = TensorDict({"token_level_scores": scores.clone(), "token_level_rewards": scores.clone(),
                     "response_mask": torch.ones(n, 3)}, batch_size=[n])
    return DataProto(batch=td, non_tensor_batch={
        "uid": np.array([u for u, _, _ in rows], dtype=object), "gagar_passed": passed,
        "gagar_hacked": np.zeros(n, bool), "gagar_patch": np.array([patches[r] for _, r, _ in rows], dtype=object),
        "gagar_instance": np.array([HACK_IID] * n, dtype=object)})


def _native(bundled_tasks, groups: list[list[tuple[str, bool]]], *overrides: str):
    """The native loop's check → keep → advantages on the same rollouts (no model: the stages only)."""
    from trainer.agent import Trajectory
    from trainer.config import load_config
    from trainer.groups import RolloutGroup
    from trainer.judging import Judge
    from trainer.loop import Trainer

    patches = _bundled(bundled_tasks, HACK_IID)
    inst = next(Instance.from_dict(r) for r in map(json.loads, (bundled_tasks / "instances.jsonl").open())
                if r["instance_id"] == HACK_IID)
    cfg = load_config(RECIPE.parents[1] / "configs" / "tiny.yaml", [f"tasks.dir={bundled_tasks}", *overrides])
    t = object.__new__(Trainer)
    t.cfg, t.repos, t.log = cfg, cfg.tasks.repos_path(), print
    t.judge = Judge(cfg.grader, t.repos)
    rgs = []
    for g, members in enumerate(groups):
        trajs = [Trajectory(HACK_IID, f"{g}-{k}-{rid}", [1, 2], [0, 1], 1, patches[rid]) for k, (rid, _) in
                 enumerate(members)]
        res = [EvalResult(HACK_IID, "m", tr.rollout_id, "resolved" if ok else "unresolved", resolved=ok)
               for tr, (_, ok) in zip(trajs, members, strict=True)]
        rgs.append(RolloutGroup(inst, trajs, res))
    t.check(rgs)
    kept = t.keep(rgs)
    adv, _ = t.advantages(kept)
    return rgs, kept, adv


ALL_PASS_WITH_HACK = [("minimal", True), ("gold", True), ("bloated", True), ("hack-special-case", True)]
FIVE_OF_EIGHT = [("minimal", True), ("hack-special-case", True), ("bloated", True), ("wrong-suffix", False),
                 ("gold", True), ("wrong-drop-minutes", False), ("unrelated", True), ("wrong-suffix", False)]


@pytest.mark.parametrize("base", ["grpo", "gapo"])
def test_verl_and_the_native_trainer_give_the_same_advantages(bundled_tasks, base):
    # An all-passing group with a special-casing hack (verl used to check only groups needs_grading selected:
    # the hack kept advantage 0 there, natively it is a failure), and a 5-of-8 group with a hack, which a gapo
    # base (centre 1, no passing advantage > 0) never sent to the judge — so it was never checked.
    groups = [ALL_PASS_WITH_HACK, FIVE_OF_EIGHT]
    rgs, kept, native = _native(bundled_tasks, groups, f"advantage.mode={base}+gagar")
    assert kept == rgs  # both groups are mixed once the hack counts as a failure
    data = _verl_batch(bundled_tasks, groups)
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "gagar": {"base": base, "tasks_dir": str(bundled_tasks)}})
    out = verl_trainer.compute_advantage(data, "gagar", config=cfg)
    got = out.batch["advantages"][:, -1]
    hacks = [g for g, (rid, _) in enumerate(ALL_PASS_WITH_HACK + FIVE_OF_EIGHT) if rid.startswith("hack")]
    assert out.non_tensor_batch["gagar_hacked"][hacks].all() and not out.non_tensor_batch["gagar_passed"][hacks].any()
    assert (got[hacks] < 0).all()  # the hack is a failure in both groups, under both bases
    want = torch.cat([native[0, :4], native[1, :8]])
    assert torch.allclose(got, want, atol=1e-6), (got, want)
    # verl's reward metrics (critic/score/*, critic/rewards/*: sums of token_level_scores / _rewards per row)
    # see the hacks as failures: their score is gone
    for key in ("token_level_scores", "token_level_rewards"):
        assert out.batch[key].sum(-1)[hacks].tolist() == [0.0, 0.0]
        assert float(out.batch[key].sum(-1).mean()) == pytest.approx(7 / 12)
    assert out.meta_info["gagar"]["gagar/grader_hacks"] == 2


def test_verl_default_base_is_grpo_like_the_native_trainer():
    assert verl_plugin.gagar_options(OmegaConf.create({}))["base"] == "grpo"
    assert verl_plugin.gagar_options(None)["form"] == "paper"
    with pytest.raises(ValueError, match="form"):
        verl_plugin.gagar_options(OmegaConf.create({"gagar": {"form": "lambda"}}))


def test_dynamic_sampling_in_the_verl_dispatch(bundled_tasks):
    # filter_groups.enable: groups whose final verdicts are all equal leave the loss (response_mask 0); the hack
    # counts as a failure, so the all-passing group with a hack stays, an all-passing clean one goes
    groups = [ALL_PASS_WITH_HACK, [("minimal", True), ("gold", True)], [("wrong-suffix", False)] * 2]
    data = _verl_batch(bundled_tasks, groups)
    cfg = OmegaConf.create({"gagar": {"tasks_dir": str(bundled_tasks)}, "filter_groups": {"enable": True}})
    out = verl_trainer.compute_advantage(data, "gagar", config=cfg)
    assert out.batch["response_mask"].sum(-1).tolist() == [3.0] * 4 + [0.0] * 4
    assert out.meta_info["gagar"]["gagar/filtered_rows"] == 4
    # without verdict columns (another reward), groups whose scores are all equal are filtered
    uids, _, mask, token_rewards = batch()
    plain = DataProto(batch=TensorDict({"token_level_rewards": token_rewards, "response_mask": mask.clone()},
                                       batch_size=[8]), non_tensor_batch={"uid": uids})
    verl_trainer.filter_groups(plain, OmegaConf.create({}))
    assert (plain.batch["response_mask"][uids == "u3"] == 0).all()  # a group of one: no signal
    assert torch.equal(plain.batch["response_mask"][uids != "u3"], mask[uids != "u3"])
