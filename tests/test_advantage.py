"""Advantage estimators against the plain-Python reference, edge cases, invariances (CPU; CUDA when present)."""

import math
import os
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch
from advantage_reference import REFS, gapo_ref, grouped_ref
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainer.advantage import ESTIMATORS, compute_advantages, mixed_outcome, register_estimator

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
EXAMPLES = 1000 if os.environ.get("GAGAR_FULL") else 100
HSET = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Dyadic rewards (multiples of 1/4) are exact in float32, so window ties are real ties for both implementations.
reward = st.integers(-40, 40).map(lambda v: v / 4)
group = st.lists(reward, min_size=1, max_size=12)
params = st.sampled_from(
    [("gapo", {}), ("gapo", {"center": "mean"}), ("gapo", {"norm": False}), ("gapo", {"coverage": 0.25}),
     ("gapo", {"coverage": 0.75, "center": "mean"}), ("gapo", {"coverage": 1.0}), ("grpo", {}),
     ("dr_grpo", {}), ("rloo", {})]
)


def ref_fn(name, kw):
    if name == "gapo":
        return lambda r: gapo_ref(r, **kw)
    return REFS[name]


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@HSET
@given(groups=st.lists(group, min_size=1, max_size=6), est=params, labels=st.sampled_from(["int", "str"]),
       seed=st.integers(0, 2**16))
def test_flat_ragged_matches_reference(device, groups, est, labels, seed):
    name, kw = est
    flat = [r for g in groups for r in g]
    index = [i for i, g in enumerate(groups) for _ in g]
    perm = np.random.default_rng(seed).permutation(len(flat))  # groups interleaved in any order
    flat = [flat[i] for i in perm]
    index = [index[i] * 7 - 3 for i in perm]
    idx = [f"uid-{i}" for i in index] if labels == "str" else torch.tensor(index, device=device)
    got = compute_advantages(torch.tensor(flat, device=device), estimator=name, index=idx, **kw)
    assert got.shape == (len(flat),) and got.device.type == device and got.dtype == torch.float32
    close(got.cpu(), grouped_ref(flat, index, ref_fn(name, kw)))


@pytest.mark.parametrize("device", DEVICES)
@HSET
@given(n=st.integers(1, 12), b=st.integers(1, 5), est=params, data=st.data())
def test_dense_matches_reference(device, n, b, est, data):
    name, kw = est
    rows = [data.draw(st.lists(reward, min_size=n, max_size=n)) for _ in range(b)]
    got = compute_advantages(torch.tensor(rows, device=device), estimator=name, **kw)
    assert got.shape == (b, n)
    close(got.cpu(), [ref_fn(name, kw)(r) for r in rows])


@pytest.mark.parametrize("device", DEVICES)
@HSET
@given(n=st.integers(2, 12), est=params, shift=st.integers(-8, 8), data=st.data())
def test_shift_scale_permutation_invariance(device, n, est, shift, data):
    name, kw = est
    r = torch.tensor([data.draw(st.lists(reward, min_size=n, max_size=n)) for _ in range(3)], device=device)
    base = compute_advantages(r, estimator=name, **kw)
    close(compute_advantages(r + shift, estimator=name, **kw).cpu(), base.cpu())
    normalised = kw.get("norm", True) and name in ("gapo", "grpo")
    scaled = compute_advantages(r * 4, estimator=name, **kw)
    # eps = 1e-6 in the denominator makes scale invariance approximate
    close(scaled.cpu(), (base if normalised else base * 4).cpu(), tol=1e-4)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n)).to(device)
    close(compute_advantages(r[:, perm], estimator=name, **kw).cpu(), base[:, perm].cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gapo", "grpo", "dr_grpo", "rloo"])
def test_edge_cases(device, name):
    one = compute_advantages(torch.tensor([[3.5]], device=device), estimator=name)
    assert one.item() == 0.0  # group of 1 -> 0
    equal = compute_advantages(torch.full((2, 5), 0.7, device=device), estimator=name)
    assert torch.equal(equal, torch.zeros_like(equal))  # all equal -> 0
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="NaN or infinite"):
            compute_advantages(torch.tensor([[0.0, bad]], device=device), estimator=name)


def test_gapo_group_of_two_and_window_ties():
    # n = 2, coverage 0.5 -> k = 1: both one-value windows have width 0 and tie; Q = their mean, the midpoint.
    a = compute_advantages(torch.tensor([[5.0, 2.0]]), norm=False)
    close(a, [[1.5, -1.5]])
    # [0, 1, 2, 3, 10, 11]: windows of 3 have widths 2, 2, 8, 8 -> [0, 1, 2] and [1, 2, 3] tie, Q = (1 + 2)/2
    a = compute_advantages(torch.tensor([[0.0, 1, 2, 3, 10, 11]]), norm=False)
    close(a, [[-1.5, -0.5, 0.5, 1.5, 8.5, 9.5]])
    # even k: median = mean of the two middle values; [0, 0, 1, 1, 9, 9, 9, 20] -> k = 4, window [0, 0, 1, 1]
    a = compute_advantages(torch.tensor([[9.0, 0, 1, 9, 0, 20, 1, 9]]), norm=False)
    close(a, [[8.5, -0.5, 0.5, 8.5, -0.5, 19.5, 0.5, 8.5]])
    # binary rewards, 3 of 8 pass: Q = 0, failing rollouts get exactly 0; 4 of 8: both blocks tie, Q = 1/2
    a = compute_advantages(torch.tensor([[1.0, 0, 0, 1, 0, 0, 1, 0]]))
    assert (a[0][[1, 2, 4, 5, 7]] == 0).all() and (a[0][[0, 3, 6]] > 0).all()
    a = compute_advantages(torch.tensor([[1.0, 0, 0, 1, 0, 1, 1, 0]]), norm=False)
    close(a, [[0.5, -0.5, -0.5, 0.5, -0.5, 0.5, 0.5, -0.5]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes_kept(device, dtype):
    r = torch.tensor([[0.0, 1, 1, 0.5], [2, 2, 3, 1]], device=device)
    for name in ESTIMATORS:
        got = compute_advantages(r.to(dtype), estimator=name)
        assert got.dtype == dtype and got.device.type == device
        close(got.float().cpu(), compute_advantages(r, estimator=name).cpu(), tol=2e-2)
    assert compute_advantages(torch.tensor([[0, 1, 1]]), estimator="grpo").dtype == torch.float32


def test_bad_usage_errors():
    with pytest.raises(ValueError, match="unknown estimator"):
        compute_advantages(torch.zeros(2, 3), estimator="nope")
    with pytest.raises(ValueError, match="index="):
        compute_advantages(torch.zeros(6))
    with pytest.raises(ValueError, match="expected \\(6,\\)"):
        compute_advantages(torch.zeros(6), index=[0, 1])
    with pytest.raises(TypeError, match="integer or string"):
        compute_advantages(torch.zeros(2), index=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="coverage"):
        compute_advantages(torch.zeros(1, 4), coverage=0.0)
    with pytest.raises(ValueError, match="center"):
        compute_advantages(torch.zeros(1, 4), center="mode")


def test_registry_is_extensible():
    @register_estimator("test_sign")
    def sign(x, sizes=None):
        return torch.sign(x)

    try:
        assert compute_advantages(torch.tensor([[-2.0, 3.0]]), estimator="test_sign").tolist() == [[-1.0, 1.0]]
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test_sign", lambda x, sizes=None: x)
    finally:
        ESTIMATORS.pop("test_sign")


def test_verl_style_object_index_and_mixed_outcome():
    uids = np.array(["b", "a", "b", "a", "c"], dtype=object)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    close(compute_advantages(r, estimator="grpo", index=uids), grouped_ref(r.tolist(), list(uids), REFS["grpo"]))
    passed = r > 0
    assert mixed_outcome(passed, uids).tolist() == [False, True, False]  # groups a, b, c (sorted)
    assert mixed_outcome(passed, uids, per_rollout=True).tolist() == [True, False, True, False, False]
    dense = torch.tensor([[True, False], [True, True], [False, False]])
    assert mixed_outcome(dense).tolist() == [True, False, False]
    assert mixed_outcome(torch.tensor([[True]])).tolist() == [False]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gapo", "grpo", "rloo"])
def test_flat_layouts_agree_with_dense(device, name):
    r = torch.tensor([[0.0, 1, 1, 0.5], [2, 2, 3, 1], [5, 5, 5, 5]], device=device)
    dense = compute_advantages(r, estimator=name)
    consecutive = torch.arange(3, device=device).repeat_interleave(4)  # the reshape fast path
    close(compute_advantages(r.reshape(-1), estimator=name, index=consecutive).cpu(), dense.reshape(-1).cpu())
    perm = torch.tensor([5, 0, 11, 2, 7, 9, 1, 4, 10, 3, 8, 6], device=device)
    got = compute_advantages(r.reshape(-1)[perm], estimator=name, index=consecutive[perm])
    close(got.cpu(), dense.reshape(-1)[perm].cpu())
    ragged = compute_advantages(r.reshape(-1)[:10], estimator=name, index=consecutive[:10])  # sizes 4, 4, 2
    close(ragged[:8].cpu(), dense.reshape(-1)[:8].cpu())
    close(ragged[8:].cpu(), compute_advantages(r[2:, :2], estimator=name).reshape(-1).cpu())


# Non-dyadic rewards (thirds, fifths, ...) are not exact in binary floating point: equal true window widths come
# out a few ulps apart, and GAPO must still treat them as ties (the mean of the tied windows' centres). The reference runs in
# exact fractions, so its ties are true ties.
DENOMS = [3, 5, 6, 7, 9, 10, 11, 13, 25, 97]
COVERAGES = [0.5, 0.25, 0.3, 0.55, 0.7, 0.75, 1.0]


@st.composite
def fraction_group(draw, min_size=1, max_size=12):
    q = draw(st.sampled_from(DENOMS))
    size = draw(st.integers(min_size, max_size))
    offset = draw(st.integers(-40, 40))
    if draw(st.booleans()):  # an evenly spread group: every window of k ties, the worst case for rounding
        step, first = draw(st.integers(1, 3)), draw(st.integers(-3 * q, 3 * q))
        nums = [first + step * j for j in range(size)]
    else:  # few distinct values, so equal widths and repeated rewards are common
        nums = draw(st.lists(st.integers(0, 2 * q), min_size=size, max_size=size))
    return [Fraction(v, q) + offset for v in draw(st.permutations(nums))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@HSET
@given(groups=st.lists(fraction_group(), min_size=1, max_size=5), coverage=st.sampled_from(COVERAGES),
       kw=st.sampled_from([{}, {"center": "mean"}, {"norm": False}]))
@example(groups=[[Fraction(32), Fraction(3105, 97)]], coverage=0.5, kw={})  # std 0.005: float32 conditioning
def test_gapo_non_dyadic_ties_match_exact_reference(dtype, groups, coverage, kw):
    flat = [r for g in groups for r in g]
    index = [i for i, g in enumerate(groups) for _ in g]
    rewards = torch.tensor([float(r) for r in flat], dtype=dtype)
    got = compute_advantages(rewards, index=index, coverage=coverage, **kw)
    # Normalising divides by the group's std: a group of near-equal large rewards ({32, 3105/97}: std 0.005)
    # turns one float32 rounding of the inputs (eps·|r|) into eps·|r|/std of the output. That error is the
    # input's, not the estimator's, so the tolerance scales with the condition number; ties stay tested, since
    # a wrong tie shifts the baseline by a whole reward gap (order 1 in normalised units).
    cond = max((float(max(abs(r) for r in g)) / statistics.pstdev([float(r) for r in g])
                for g in groups if len(set(g)) > 1), default=1.0) if kw.get("norm", True) else max(
        float(abs(r)) for r in flat)
    tol = max(1e-4, 8 * torch.finfo(dtype).eps * cond)
    close(got, grouped_ref(flat, index, lambda r: gapo_ref(r, coverage=coverage, **kw)), tol=tol)
    if len({len(g) for g in groups}) == 1:  # the dense fast path must agree too
        dense = compute_advantages(rewards.reshape(len(groups), -1), coverage=coverage, **kw)
        close(dense.reshape(-1), got, tol=tol)


@pytest.mark.parametrize("q", [3, 5, 7, 10])
@pytest.mark.parametrize("n", [4, 6, 8, 11, 16])
def test_gapo_evenly_spread_grid_is_symmetric(q, n):
    # r_j = j/q: every window of k has width (k−1)/q and ties; the mean of their centres is the midpoint, so the
    # advantages are antisymmetric and sum to 0 (the old lowest-window rule gave most of them a positive sign,
    # float32 rounding before it the opposite)
    r = [Fraction(j, q) for j in range(n)]
    mid = (r[0] + r[-1]) / 2
    got = compute_advantages(torch.tensor([[float(v) for v in r]]), norm=False)
    close(got[0], [float(v - mid) for v in r])
    assert abs(float(compute_advantages(torch.tensor([[float(v) for v in r]])).sum())) < 1e-5


@HSET
@given(n=st.integers(2, 16), q=st.sampled_from(DENOMS), step=st.integers(1, 5), first=st.integers(-500, 500),
       coverage=st.sampled_from(COVERAGES), kw=st.sampled_from([{}, {"center": "mean"}, {"norm": False}]),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_gapo_evenly_spaced_rewards_sum_to_zero(n, q, step, first, coverage, kw, dtype, seed):
    # Unbiased for evenly spaced rewards, whatever their offset, step, order, coverage or centre.
    r = torch.tensor([(first + step * j) / q for j in range(n)], dtype=dtype)
    r = r[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
    a = compute_advantages(r[None], coverage=coverage, **kw)
    scale = float(r.abs().max()) + 1 if kw.get("norm") is False else 1.0
    tol = (1e-4 if dtype == torch.float32 else 1e-9) * scale * n
    assert abs(float(a.sum())) <= tol
    ragged = compute_advantages(torch.cat([r, torch.tensor([0.5], dtype=dtype)]), index=[0] * n + [1],
                                coverage=coverage, **kw)
    close(ragged[:n], a[0], tol=1e-4 if dtype == torch.float32 else 1e-8)


@HSET
@given(groups=st.lists(fraction_group(min_size=3), min_size=1, max_size=4), big=st.sampled_from([1e3, 1e6, 3.3e7]),
       coverage=st.sampled_from([0.5, 0.55, 0.7]), kw=st.sampled_from([{}, {"center": "mean"}]))
def test_gapo_far_outlier_does_not_move_the_centre(groups, big, coverage, kw):
    # The tie tolerance comes from each window's own values: adding one far outlier to a group changes Q only
    # as the exact rule says (k may grow by one), never through a tolerance inflated by the outlier's size.
    flat, index = [], []
    for g, rows in enumerate(groups):
        flat += [*rows, Fraction(big)]
        index += [g] * (len(rows) + 1)
    got = compute_advantages(torch.tensor([float(v) for v in flat]), index=index, coverage=coverage, norm=False,
                             **kw)
    want = grouped_ref(flat, index, lambda r: gapo_ref(r, coverage=coverage, norm=False, **kw))
    # compare the centres Q = r − A on the group's ordinary rewards (the outlier's own A is ~big)
    keep = [i for i, v in enumerate(flat) if v != big]
    q_got = np.array([float(flat[i]) for i in keep]) - got.numpy()[keep]
    q_want = np.array([float(flat[i]) for i in keep]) - np.array(want)[keep]
    np.testing.assert_allclose(q_got, q_want, atol=1e-4)


def test_gapo_issue_example_thirds():
    want = [-1.1619, -0.3873, 0.3873, 1.1619]  # the three windows of 2 tie: Q = mean(1/6, 1/2, 5/6) = 1/2
    dense = compute_advantages(torch.tensor([[0.0, 1 / 3, 2 / 3, 1.0]]))
    close(dense[0], want, tol=1e-4)
    flat = compute_advantages(torch.tensor([1.0, 0.0, 2 / 3, 1 / 3, 5.0]), index=[0, 0, 0, 0, 1])
    close(flat, [want[3], want[0], want[2], want[1], 0.0], tol=1e-4)
    # the old tolerance scaled with the group's largest |r| (0.95 for 1e6 in float32): windows of widths 0.9, 0.5
    # and 0.2 tied and the lowest won (Q = 0.5); now [0.9, 1, 1.1] is the narrowest, alone: Q = 1
    with_outlier = compute_advantages(torch.tensor([[0.0, 0.5, 0.9, 1.0, 1.1, 1e6]]), norm=False)
    close(with_outlier[0, :5], [-1.0, -0.5, -0.1, 0.0, 0.1])


def test_window_size_is_integer_exact():
    from trainer.advantage.estimators import window_size

    assert window_size(100, 0.55) == 55  # float ceil(0.55 * 100) = ceil(55.000000000000007) = 56
    assert window_size(10, 0.1 + 0.2) == 3 and window_size(20, 0.7) == 14 and window_size(3, 0.5) == 2
    for pct in range(1, 101):
        ns = torch.arange(1, 301)
        exact = [min(max(-(-pct * n // 100), 1), n) for n in range(1, 301)]
        assert window_size(ns, pct / 100).tolist() == exact
        assert [window_size(n, pct / 100) for n in range(1, 301)] == exact
