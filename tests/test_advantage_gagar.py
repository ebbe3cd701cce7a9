"""GAGAR redistribution, weights helpers, hack verdicts, downweight ablation (CPU; CUDA when present)."""

import math
import os

import numpy as np
import pytest
import torch
from advantage_reference import gapo_ref, redistribute_ref
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainer.advantage import (
    apply_hack_verdicts,
    compute_advantages,
    downweight,
    gagar_advantages,
    needs_grading,
    redistribute,
    weights_for,
    weights_from_ranking,
    weights_from_tiers,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
EXAMPLES = 1000 if os.environ.get("GAGAR_FULL") else 100
HSET = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# One group: which rollouts pass, a partial-credit reward, and a grader weight per rollout (NaN sometimes). Weights
# include non-dyadic values (1/3, 0.7, 0.45) and repeats (ties within a tier).
rollout = st.tuples(st.booleans(), st.integers(0, 4),
                    st.sampled_from([1.0, 0.6, 0.2, 0.45, 0.9, 1 / 3, 0.7, math.nan]))
group = st.lists(rollout, min_size=1, max_size=10)


def build(groups):
    """Passing rollouts earn 1 + q/4, failing ones q/8 (< 1): passing rewards always exceed failing ones."""
    rewards, passed, weights, index = [], [], [], []
    for g, rows in enumerate(groups):
        for ok, q, w in rows:
            rewards.append(1 + q / 4 if ok else q / 8)
            passed.append(ok)
            weights.append(w)
            index.append(g)
    return rewards, passed, weights, index


@pytest.mark.parametrize("device", DEVICES)
@HSET
@given(groups=st.lists(group, min_size=1, max_size=5), cap=st.sampled_from([None, 3.0, 1.5, 1.0]),
       est=st.sampled_from(["gapo", "grpo", "rloo"]), seed=st.integers(0, 2**16))
# Found by CI: two tier-0.2 rollouts, the one with the smaller base advantage lifted to the floor.
@example(groups=[[(False, 0, 1.0), (True, 1, 0.2), (False, 0, 1.0), (False, 0, 1.0), (False, 2, 1.0), (True, 0, 1.0),
                  (True, 0, 0.2)]], cap=None, est="gapo", seed=0)
def test_redistribute_invariants(device, groups, cap, est, seed):
    rewards, passed, weights, index = build(groups)
    perm = np.random.default_rng(seed).permutation(len(rewards))  # ragged groups, interleaved in any order
    rewards, passed, weights, index = ([x[i] for i in perm] for x in (rewards, passed, weights, index))
    r = torch.tensor(rewards, device=device)
    p = torch.tensor(passed, device=device)
    w = torch.tensor(weights, device=device)
    adv = compute_advantages(r, index=index, estimator=est)
    out = redistribute(adv, p, w, index=index, cap=cap)
    assert out.shape == adv.shape and out.device.type == device
    idx, wn = np.array(index), np.array(weights)
    a0, a1, pn = adv.cpu().numpy().astype(np.float64), out.cpu().numpy().astype(np.float64), np.array(passed)
    for g in range(len(groups)):
        m = idx == g
        expect = redistribute_ref(a0[m].tolist(), pn[m].tolist(), wn[m].tolist(), cap=cap)
        np.testing.assert_allclose(a1[m], expect, rtol=1e-5, atol=1e-6)
        assert np.array_equal(a1[m & ~pn], a0[m & ~pn])  # failing rollouts unchanged
        assert np.array_equal(a1[m & pn & (a0 <= 0)], a0[m & pn & (a0 <= 0)])  # so are passing ones with A <= 0
        pos = m & pn & (a0 > 0)
        if not pos.any() or np.isnan(wn[pos]).any():
            assert np.array_equal(a1[m], a0[m])  # nothing to move, or no usable grading: unchanged
            continue
        # the group's positive total is preserved exactly (float32 rounding only), whatever the cap does
        assert abs(a1[pos].sum() - a0[pos].sum()) <= 1e-5 * max(1.0, abs(a0[pos]).sum())
        f = wn[pos] / wn[pos].max()
        top = f == 1.0
        assert (a1[pos][~top] <= a0[pos][~top]).all()  # no lower-ranked patch is boosted
        assert (a1[pos][top] >= a0[pos][top] * (1 - 1e-6)).all()  # the top tier receives what was removed
        if cap is not None:
            assert (a1[pos][top] <= cap * a0[pos][top] * (1 + 1e-5)).all()
        # The multiplier is non-decreasing in the tier weight, except where the floor of invariant 7 lifted a
        # rollout (kept just above the best failing one, or above 0): there a small base advantage in a low tier
        # ends with a larger multiplier than an equal-tier rollout with a larger base.
        fail_max = max([0.0] + a0[m & ~pn].tolist())
        free = a1[pos] > fail_max + 1e-5 * max(1.0, abs(fail_max))
        mult = (a1[pos] / a0[pos])[free]
        order = np.argsort(f[free], kind="stable")
        assert (np.diff(mult[order]) >= -1e-5).all()
        assert (a1[pos] > 0).all()
        if (m & ~pn).any():
            above = a0[pos] > a0[m & ~pn].max()
            assert (a1[pos][above] > a0[m & ~pn].max()).all()  # above every failing rollout before: still above
        if len(set(wn[pos].tolist())) == 1:
            assert np.array_equal(a1[m], a0[m])  # equal weights: the exact identity


@HSET
@given(groups=st.lists(group, min_size=1, max_size=5), cap=st.sampled_from([None, 3.0, 1.5]))
def test_scale_variant_matches_reference(groups, cap):
    rewards, passed, weights, index = build(groups)
    adv = compute_advantages(torch.tensor(rewards), index=index)
    out = redistribute(adv, torch.tensor(passed), torch.tensor(weights), index=index, cap=cap, form="scale")
    idx, wn, pn, a0 = np.array(index), np.array(weights), np.array(passed), adv.numpy()
    for g in range(len(groups)):
        m = idx == g
        expect = redistribute_ref(a0[m].tolist(), pn[m].tolist(), wn[m].tolist(), cap=cap, form="scale")
        np.testing.assert_allclose(out.numpy()[m], expect, rtol=1e-5, atol=1e-6)


def test_paper_form_never_boosts_a_middle_tier_and_keeps_the_sum_when_capped():
    # tiers 1, 2, 3, 3, 3, 3 on equal GRPO advantages: the λ form boosts the tier-2 rollout (λ = 2.5, 1.5·A)
    adv = torch.tensor([[1.0, 1, 1, 1, 1, 1, -2, -2, -2]])
    p = torch.tensor([[True] * 6 + [False] * 3])
    w = torch.tensor([[1.0, 0.6, 0.2, 0.2, 0.2, 0.2, 1, 1, 1]])
    scale = redistribute(adv, p, w, form="scale", cap=None)
    assert scale[0, 1] > adv[0, 1]
    paper = redistribute(adv, p, w, cap=None)
    assert torch.allclose(paper[0, :6], torch.tensor([1 + 0.4 + 3.2, 0.6, 0.2, 0.2, 0.2, 0.2]))
    capped = redistribute(adv, p, w)  # cap 3: the top may get 3·A = 3, so only 2 of the 3.6 are removed
    s = 2.0 / 3.6
    assert torch.allclose(capped[0, :6], torch.tensor([3.0] + [1 - s * 0.4] + [1 - s * 0.8] * 4))
    assert torch.allclose(capped[0, :6].sum(), torch.tensor(6.0))  # sum kept while the cap binds
    assert torch.equal(capped[0, 6:], adv[0, 6:])
    old = redistribute(adv, p, w, form="scale", cap=2.0)
    assert old[0, :6].sum() < 6  # the λ form loses positive mass when its cap binds
    assert torch.equal(redistribute(adv, p, w, cap=1.0), adv)  # cap 1: the top may not grow, nothing moves


@pytest.mark.parametrize("device", DEVICES)
def test_identity_when_weights_equal_and_unusable_groups_unchanged(device):
    r = torch.tensor([[1.0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 1], [0, 1, 0, 0, 0, 0]], device=device)
    p = r > 0
    adv = compute_advantages(r)
    for f in (1.0, 0.6, 0.2, 1 / 3):
        for form in ("paper", "scale"):
            assert torch.equal(redistribute(adv, p, torch.full_like(r, f), form=form), adv)
    w = torch.tensor([[1.0, 9, 0.2, 0.6, 9, 9], [math.nan, 1, 9, 9, 9, 0.2], [9, 0.2, 9, 9, 9, 9]], device=device)
    w = torch.where(p, w, torch.full_like(w, math.nan))  # failing rollouts carry no weight
    out = redistribute(adv, p, w)
    assert torch.equal(out[1], adv[1])  # a NaN weight on a passing rollout: grading unusable
    assert torch.equal(out[2], adv[2])  # one passing rollout: it is the top tier, nothing to move
    assert not torch.equal(out[0], adv[0])
    assert torch.allclose(out[0][p[0]].sum(), adv[0][p[0]].sum())
    kept = redistribute(adv, p, w, usable=torch.tensor([False, True, True], device=device))
    assert torch.equal(kept[0], adv[0])


def test_bf16_and_bad_arguments():
    adv = torch.tensor([[1.0, 1, 1, 1, 1, 1, -2, -2]])
    p = torch.tensor([[True] * 6 + [False] * 2])
    w = torch.tensor([[1.0, 0.2, 0.2, 0.2, 0.2, 0.2, 1, 1]])
    full = redistribute(adv, p, w)
    half = redistribute(adv.bfloat16(), p, w.bfloat16())
    assert half.dtype == torch.bfloat16 and torch.allclose(half.float(), full, atol=2e-2)
    with pytest.raises(ValueError, match="cap"):
        redistribute(adv, p, w, cap=0.5)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        redistribute(adv, p, torch.full_like(w, 1.5))
    with pytest.raises(ValueError, match="form"):
        redistribute(adv, p, w, form="lambda")


def test_floor_keeps_passing_above_positive_failing():
    # Non-binary rewards: a failing rollout can carry a positive advantage; a low-weight passing one must stay above.
    adv = torch.tensor([[3.0, 0.5, 0.4, -1.0]])
    p = torch.tensor([[True, True, False, False]])
    w = torch.tensor([[1.0, 0.2, math.nan, math.nan]])
    out = redistribute(adv, p, w)
    assert out[0, 1] > out[0, 2] == 0.4 and out[0, 3] == -1.0
    assert torch.allclose(out[0, :2].sum(), adv[0, :2].sum())  # the floor lowers what moves, the sum stays


def test_downweight_shrinks_the_signal():
    adv = compute_advantages(torch.tensor([[1.0, 1, 1, 0, 0, 0, 0, 0]]))
    p = adv > 0
    w = torch.tensor([[1.0, 0.6, 0.2, 1, 1, 1, 1, 1]])
    down = downweight(adv, p, w)
    assert torch.allclose(down, adv * torch.where(p, w, torch.ones_like(w)))
    assert down[p].sum() < adv[p].sum()
    assert torch.allclose(redistribute(adv, p, w)[p].sum(), adv[p].sum())
    assert torch.allclose(redistribute(adv, p, w, form="scale")[p].sum(), adv[p].sum())


def test_hack_verdicts_turn_rollouts_into_failures():
    r = torch.tensor([[1.0, 1, 0, 1]])
    p = r > 0
    hacked = torch.tensor([[False, True, False, False]])
    r2, p2 = apply_hack_verdicts(r, p, hacked)
    assert r2.tolist() == [[1.0, 0.0, 0.0, 1.0]] and p2.tolist() == [[True, False, False, True]]
    w = torch.tensor([[1.0, 1.0, math.nan, 0.2]])
    adv = gagar_advantages(r, p, w, hacked=hacked)
    base = torch.tensor([gapo_ref([1.0, 0.0, 0.0, 1.0])])
    assert adv[0, 1] == base[0, 1] and adv[0, 1] <= 0  # the hack is scored as the failure it is
    assert adv[0, 0] > adv[0, 3] > 0


def test_weight_helpers():
    assert weights_from_tiers({"a": 1, "b": 2, "c": 3}) == {"a": 1.0, "b": 0.6, "c": 0.2}
    t = weights_from_tiers(torch.tensor([1, 3, 0]))
    assert t[:2].tolist() == pytest.approx([1.0, 0.2]) and math.isnan(t[2])
    assert weights_from_tiers([1, 2], values={1: 1.0, 2: 0.5}).tolist() == [1.0, 0.5]
    with pytest.raises(ValueError, match="unknown tier"):
        weights_from_tiers([4])
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        weights_from_tiers([1], values={1: 0.0})
    ranked = weights_from_ranking(["x", "y", "z"])
    assert ranked == pytest.approx({"x": 1.0, "y": 0.6, "z": 0.2})
    assert weights_from_ranking(["only"]) == {"only": 1.0}
    with pytest.raises(ValueError, match="twice"):
        weights_from_ranking(["x", "x"])
    looked = weights_for(["x", "q", "z"], ranked)
    assert looked[0] == 1.0 and math.isnan(looked[1])


def test_needs_grading_binary_gapo_vs_grpo():
    # 5 of 8 pass: GAPO's centre is 1, every passing advantage is 0 -> no judge call; GRPO's mean keeps them > 0
    r = torch.tensor([[1.0, 1, 0, 1, 1, 0, 1, 0], [1.0, 0, 0, 0, 0, 0, 1, 0], [0.0] * 8])
    p = r > 0
    assert needs_grading(compute_advantages(r), p).tolist() == [False, True, False]
    assert needs_grading(compute_advantages(r, estimator="grpo"), p).tolist() == [True, True, False]
    per = needs_grading(compute_advantages(r), p, per_rollout=True)
    assert per.shape == r.shape and per[1].all() and not per[0].any()
    flat = needs_grading(compute_advantages(r.reshape(-1), index=[f"g{i // 8}" for i in range(24)]),
                         p.reshape(-1), [f"g{i // 8}" for i in range(24)])
    assert flat.tolist() == [False, True, False]
    with pytest.raises(ValueError, match="shape"):
        needs_grading(torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.bool))


@HSET
@given(groups=st.lists(group, min_size=1, max_size=5), est=st.sampled_from(["gapo", "grpo", "rloo"]))
def test_needs_grading_is_exactly_where_grading_can_change_something(groups, est):
    rewards, passed, weights, index = build(groups)
    perm = np.random.default_rng(len(rewards)).permutation(len(rewards))  # ragged, interleaved groups
    r = torch.tensor(rewards)[perm]
    p = torch.tensor(passed)[perm]
    idx = [index[i] for i in perm]
    adv = compute_advantages(r, estimator=est, index=idx)
    need = needs_grading(adv, p, idx, per_rollout=True)
    assert needs_grading(adv, p, idx).tolist() == [bool(need[torch.tensor(idx) == g].any()) for g in range(len(groups))]
    # a skipped group is left unchanged by redistribution whatever the judge would have said
    harsh = torch.where(torch.arange(len(r)) % 2 == 0, torch.tensor(1.0), torch.tensor(0.2))
    out = redistribute(adv, p, harsh, index=idx)
    assert torch.equal(out[~need], adv[~need])
