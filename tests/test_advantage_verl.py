"""The verl plugin against the real verl 0.9.1 registry (installed by the Makefile, --no-deps; see docs)."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos

from trainer.advantage import compute_advantages, gagar_advantages
from trainer.integrations import verl_plugin


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


def test_gagar_with_weights_hacks_and_fallback():
    uids, scores, mask, token_rewards = batch()
    fn = core_algos.get_adv_estimator_fn("gagar")
    weights = np.array([1.0, math.nan, math.nan, 0.2, 0.6, 1.0, math.nan, 1.0])
    hacked = np.array([False, False, False, False, True, False, False, False])
    cfg = OmegaConf.create({"gagar": {"cap": 2.0}})
    adv, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=uids, config=cfg,
                non_tensor_batch={"uid": uids, "gagar_weight": weights, "gagar_hacked": hacked})
    expect = gagar_advantages(scores, scores > 0.5, torch.tensor(weights, dtype=torch.float32), index=list(uids),
                              hacked=torch.tensor(hacked), cap=2.0)
    assert torch.allclose(adv, expect[:, None] * mask)
    assert (adv[4] == 0).all() and adv[0].max() > 0  # the hack is a failure now (GAPO: Q = 0)
    # no grader weights: GAGAR falls back to GAPO
    plain, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=uids, config=None)
    assert torch.allclose(plain, compute_advantages(scores, index=list(uids))[:, None] * mask)
