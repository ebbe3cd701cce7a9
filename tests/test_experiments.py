"""`gagar experiment bloat|skew`: short runs produce well-formed results; the harness's pieces do what they say.

Most bloat tests use TINY_CACHE, a purpose-made verdict cache that stands for what `verdicts.build_verdicts`
writes: the sandbox's verdicts (reward, diff size) of three tasks' patches and the heuristic grader's weights for
every subset of each task's passing patches (tiers 1 / 3 → weights 1.0 / 0.2, as the grader maps them). The
docker-marked test builds a real cache from one bundled task with the real sandbox and the real grader.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.experiments import cli
from trainer.experiments.bloat import METRICS, Bandit, BloatConfig, run_bloat, run_method
from trainer.experiments.skew import (
    SHAPES,
    SkewConfig,
    generate,
    ppo_clip_fraction,
    run_skew,
    true_rank_signs,
)
from trainer.experiments.verdicts import (
    FORMAT,
    VerdictError,
    build_verdicts,
    diff_size,
    load_verdicts,
    subset_key,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread():
    """The CLI runs on one intra-op thread (tiny tensors); do the same here and restore the setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_cache() -> dict:
    """Three tasks; each has a minimal fix (2 lines), a bloated one (12 lines), a gold one (5 lines, task 0
    only) and two failing patches; task 0 also a hack (1 line) that passes the sandbox and that the grader's
    hack check fails, as `verdicts.build_verdicts` records it. The grader puts the smallest passing patches in
    tier 1, bloated and the hack in tier 3; gradings cover every subset of the sandbox-passing patches."""
    patches: dict[str, dict] = {}
    tasks = []
    for t in range(3):
        cands = [("minimal", 1, 1.0, 2), ("bloated", 3, 1.0, 12), ("wrong-a", None, 0.0, 3), ("wrong-b", None, 0.0, 4)]
        if t == 0:
            cands.insert(1, ("gold", 2, 1.0, 5))
            cands.append(("hack", None, 0.0, 1))
        entries = []
        for rid, rank, reward, lines in cands:
            h = f"t{t}-{rid}"
            patches[h] = {"status": "resolved" if reward or rid == "hack" else "unresolved", "resolved": bool(reward),
                          "sandbox_passed": bool(reward) or rid == "hack",
                          "grader_hack": "special_casing" if rid == "hack" else None, "passed": bool(reward),
                          "tampered_tests": False, "reward": reward, "tests_passed": 0, "tests_total": 0,
                          "diff_lines": lines, "files_changed": 1}
            entries.append({"rollout_id": rid, "patch_hash": h, "kind": rid.split("-")[0], "quality_rank": rank})
        graded = [e["rollout_id"] for e in entries if patches[e["patch_hash"]]["sandbox_passed"]]
        gradings = {}
        for k in range(1, len(graded) + 1):
            for combo in itertools.combinations(graded, k):
                tiers = {r: (3 if r in ("bloated", "hack") and len(combo) > 1 else 1) for r in combo}
                gradings[subset_key(combo)] = {"ranking": sorted(combo, key=lambda r: tiers[r]), "tiers": tiers,
                                               "weights": {r: 1.0 if v == 1 else 0.2 for r, v in tiers.items()},
                                               "fallback": False,
                                               "hacks": {"hack": "special_casing"} if "hack" in combo else {}}
        tasks.append({"instance_id": f"task-{t}", "repo": "acme/x", "candidates": entries, "gradings": gradings})
    return {"format": FORMAT, "source": {"purpose": "test stand-in"}, "tasks": tasks, "patches": patches}


TINY_CACHE = _tiny_cache()


def test_diff_size_counts_changed_lines_and_files():
    patch = ("diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a = 1\n+a = 2\n b = 3\n")
    assert diff_size(patch) == (2, 1)
    assert diff_size("") == (0, 0)


def test_weight_table_matches_gradings():
    bandit = Bandit(TINY_CACHE)
    table = bandit.weight_table()
    ids = bandit.rollout_ids[0]
    bits = bandit.passing_bits()[0]
    assert bits[ids.index("wrong-a")] == 0  # failing patches never enter a grading
    mask = int(bits[ids.index("minimal")] + bits[ids.index("bloated")])
    assert table.shape == (3, 2**4, 6)  # 4 sandbox-passing patches at most (the hack too), 6 candidates at most
    assert table[0, mask, ids.index("minimal")] == 1.0
    assert table[0, mask, ids.index("bloated")] == pytest.approx(0.2)
    assert torch.isnan(table[0, mask, ids.index("gold")])  # not in that group
    # Tier 1 of the grading of all passing patches together: minimal and gold, not bloated.
    assert [ids[j] for j in bandit.top_tier[0].nonzero().flatten().tolist()] == ["minimal", "gold"]


@pytest.mark.parametrize("method", ["grpo", "grpo+gagar", "grpo+gagar-scale", "gapo+gagar", "downweight"])
def test_a_grader_hack_never_keeps_a_positive_advantage(method):
    # The harness scores what the trainer scores: a patch the sandbox passed but the grader's hack check failed
    # earns 0 (it used to earn 1: a hack kept a positive advantage, and GAGAR even weighted it).
    from trainer.experiments.bloat import sample_step, step_advantages

    bandit = Bandit(TINY_CACHE)
    hack = bandit.rollout_ids[0].index("hack")
    assert not bandit.passing[0, hack] and bandit.graded[0, hack]
    logits = torch.zeros((4, *bandit.shape), dtype=torch.float64).masked_fill(~bandit.valid, float("-inf"))
    gens = [torch.Generator().manual_seed(s) for s in range(4)]
    seen = 0
    for _ in range(30):
        _, picks, rewards, weights = sample_step(bandit, logits, 8, gens)
        adv, _ = step_advantages(method, rewards, weights, BloatConfig())
        task0 = torch.arange(picks.shape[0]) % bandit.shape[0] == 0
        is_hack = (picks == hack) & task0[:, None]
        seen += int(is_hack.sum())
        assert (adv[is_hack] <= 0).all()
        mixed = is_hack.any(1) & (rewards > 0).any(1)
        if method != "gapo+gagar":  # GAPO's centre is 0 while fewer than half pass: a failure gets exactly 0
            assert (adv[is_hack & mixed[:, None]] < 0).all()
    assert seen > 50


def test_bloat_short_run_is_well_formed_and_learns():
    cfg = BloatConfig(steps=40, n=8, lr=1.0)
    result = run_bloat(TINY_CACHE, cfg, seeds=3)
    json.dumps(result)
    assert set(result["methods"]) == {"grpo", "grpo+gagar", "grpo+gagar-scale", "gapo+gagar", "downweight"}
    for data in result["methods"].values():
        curves = data["curves"]
        assert set(curves) == set(METRICS)
        assert len(curves["pass_rate"]["mean"]) == cfg.steps + 1  # policy read before each step and at the end
        assert len(curves["pos_adv"]["mean"]) == cfg.steps
        assert curves["pass_rate"]["mean"][0] == pytest.approx(np.mean([3 / 6, 2 / 4, 2 / 4]))  # uniform start
        assert data["final"]["pass_rate"]["mean"] > curves["pass_rate"]["mean"][0] + 0.2
        assert 0.0 <= data["final"]["minimal_share"]["mean"] <= data["final"]["top_tier_share"]["mean"] <= 1.0
        assert 2.0 <= data["final"]["diff_lines"]["mean"] <= 12.0
        assert len(data["per_seed_final"]) == 3
    assert [t["passing"] for t in result["tasks"]] == [3, 2, 2]  # the hack is no pass
    assert [t["grader_hacks"] for t in result["tasks"]] == [1, 0, 0]
    assert result["methods"]["grpo"]["curves"]["graded_groups"]["mean"] == [0.0] * cfg.steps  # no grader


def test_gapo_on_binary_rewards_skips_the_judge_once_most_pass():
    # Binary rewards: GRPO's mean keeps every passing advantage of a mixed group positive, so every mixed group
    # with two or more passing rollouts is judged; GAPO's centre is 1 once more than half a group passes, so
    # those groups need no judge call.
    bandit = Bandit(TINY_CACHE)
    cfg = BloatConfig(steps=40, n=8, lr=1.0)
    seeds = list(range(4))
    grpo = run_method("grpo+gagar", bandit, cfg, seeds)
    gapo = run_method("gapo+gagar", bandit, cfg, seeds)
    assert np.all(grpo["graded_groups"] <= grpo["mixed_groups"])
    assert grpo["graded_groups"].mean() > 0.95 * grpo["mixed_groups"].mean()  # all but lone passes
    assert np.all(gapo["graded_groups"] <= gapo["mixed_groups"])
    late = slice(cfg.steps // 2, None)  # the policy passes more than half the time by then
    assert gapo["graded_groups"][:, late].mean() < 0.5 * gapo["mixed_groups"][:, late].mean()


def test_gagar_raises_minimal_share_where_grpo_is_indifferent():
    bandit = Bandit(TINY_CACHE)
    cfg = BloatConfig(steps=60, n=8, lr=1.0)
    seeds = list(range(8))
    grpo = run_method("grpo", bandit, cfg, seeds)
    gagar = run_method("grpo+gagar", bandit, cfg, seeds)
    start = grpo["minimal_share"][:, 0].mean()
    assert gagar["minimal_share"][:, -1].mean() > start + 0.15
    assert abs(grpo["minimal_share"][:, -1].mean() - start) < 0.15
    assert gagar["diff_lines"][:, -1].mean() < grpo["diff_lines"][:, -1].mean()


def test_downweight_shrinks_the_positive_signal_gagar_preserves():
    bandit = Bandit(TINY_CACHE)
    cfg = BloatConfig(steps=1, n=8, lr=1.0)
    seeds = list(range(6))  # step 0 sees the same logits and the same samples in every method
    grpo = run_method("grpo", bandit, cfg, seeds)["pos_adv"][:, 0]
    gagar = run_method("grpo+gagar", bandit, cfg, seeds)["pos_adv"][:, 0]
    down = run_method("downweight", bandit, cfg, seeds)["pos_adv"][:, 0]
    assert np.all(gagar <= grpo + 1e-9)  # equal unless the λ cap binds
    assert gagar.sum() > 0.9 * grpo.sum()
    assert np.all(down <= gagar + 1e-9) and down.sum() < 0.9 * gagar.sum()


def test_skew_short_run_is_well_formed():
    cfg = SkewConfig(n=8, configs=120, replicates=4)
    result = run_skew(2, cfg)
    json.dumps(result)
    assert set(result["summary"]) == {"grpo", "gapo"}
    for est, rows in result["summary"].items():
        assert rows["all"]["sign_error_rank"]["mean"] < 0.45, est  # far better than a coin
        for shape, row in rows.items():
            for key in ("sign_error_rank", "sign_error_value", "zero_adv", "clip_frac"):
                assert 0.0 <= row[key]["mean"] <= 1.0, (est, shape, key)
            assert row["rank_var"]["mean"] >= 0.0
    # GRPO's advantages are z-scores per group (Bessel-corrected std): Σ A² = n − 1 in every group, so the
    # pooled variance is (n − 1)/n.
    assert result["summary"]["grpo"]["all"]["adv_var"]["mean"] == pytest.approx(7 / 8, abs=0.01)
    shares = [result["per_seed"][0]["calibration"][s]["share"] for s in SHAPES]
    assert sum(shares) == pytest.approx(1.0)
    assert shares[0] > 0.5  # most groups are "normal", as in the GAPO paper's proportions


def test_true_rank_signs_split_each_group_in_halves():
    rng = np.random.default_rng(0)
    q = np.clip(rng.normal(0.5, 0.4, size=(50, 3, 8)), 0, 1)  # many ties at 0 and 1
    s = true_rank_signs(q, rng)
    assert np.all(s.sum(-1) == 0)
    best = np.argmax(q + np.arange(8) * 1e-12, -1)
    assert np.all(np.take_along_axis(s, best[..., None], -1) == 1)


def test_sign_errors_count_a_zero_advantage_as_half_and_clipping_is_compared_at_equal_scale():
    from trainer.experiments.skew import _metrics, sign_errors

    adv = np.array([[[1.0, -1.0, 0.0, 0.0]]])
    sign = np.array([[[1.0, 1.0, 1.0, -1.0]]])
    assert sign_errors(adv, sign).tolist() == [[[0.0, 1.0, 0.5, 0.5]]]
    # two estimators with the same signs and order, one at a tenth of the scale: it is clipped less, for that
    # reason alone; at equal mean |A| the two clip equally often
    q = np.array([[[0.1, 0.2, 0.8, 0.9]]])
    data = {"q": q, "pop_mean": np.array([0.5]), "shapes": np.array([0])}
    s_rank = np.array([[[-1.0, -1.0, 1.0, 1.0]]])
    cfg = SkewConfig(n=4, configs=1, replicates=2, epochs=4, lr=0.1)
    big = _metrics(np.array([[[-20.0, -10.0, 10.0, 20.0]]]), data, s_rank, cfg)["all"]
    small = _metrics(np.array([[[-2.0, -1.0, 1.0, 2.0]]]), data, s_rank, cfg)["all"]
    assert small["clip_frac"] < big["clip_frac"] and small["clip_frac_matched"] == big["clip_frac_matched"]
    zeros = _metrics(np.array([[[0.0, 0.0, 1.0, 2.0]]]), data, s_rank, cfg)["all"]
    assert zeros["sign_error_rank"] == 0.25 and zeros["sign_error_rank_strict"] == 0.0


def test_ppo_clip_fraction():
    cfg = SkewConfig(epochs=4, lr=0.1, clip_eps=0.2)
    adv = np.array([0.0, 0.01, 10.0, -10.0])
    # |A| = 10: the first epoch moves log π by ±1, past the band, so the next three epochs are clipped.
    assert ppo_clip_fraction(adv, cfg).tolist() == [0.0, 0.0, 0.75, 0.75]


def test_cli_skew_writes_json_and_png(tmp_path):
    rc = cli.main(["skew", "--seeds", "1", "--configs", "40", "--replicates", "3", "--n", "8", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "skew.json").read_text())
    assert data["experiment"] == "skew" and data["config"]["n"] == 8
    assert (tmp_path / "skew.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc = cli.main(["skew", "--reward", "tests", "--seeds", "1", "--configs", "40", "--replicates", "3", "--n", "8",
                   "--out", str(tmp_path)])
    assert rc == 0 and json.loads((tmp_path / "skew-tests.json").read_text())["config"]["reward"] == "tests"


def test_skew_tests_reward_is_a_grid_of_test_fractions():
    cfg = SkewConfig(n=8, configs=50, replicates=3, tests=20, reward="tests")
    data = generate(np.random.default_rng(0), cfg)
    assert np.allclose(data["rewards"] * 20, np.round(data["rewards"] * 20))


def test_cli_bloat_reuses_a_verdict_cache(tmp_path):
    cache = tmp_path / "verdicts.json"
    cache.write_text(json.dumps(TINY_CACHE))
    rc = cli.main(["bloat", "--verdicts", str(cache), "--seeds", "2", "--steps", "5", "--out", str(tmp_path / "o")])
    assert rc == 0
    data = json.loads((tmp_path / "o" / "bloat.json").read_text())  # strict JSON: NaN written as null
    assert data["config"]["steps"] == 5 and len(data["methods"]["grpo"]["curves"]["entropy"]["mean"]) == 6
    assert (tmp_path / "o" / "bloat.png").stat().st_size > 1000


def test_cli_bad_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert cli.main(["bloat", "--verdicts", str(bad), "--out", str(tmp_path)]) == 2
    assert "not a verdict cache" in capsys.readouterr().err
    assert cli.main(["bloat", "--verdicts", str(bad), "--methods", "grpo,ppo", "--out", str(tmp_path)]) == 2
    assert cli.main(["skew", "--n", "7", "--out", str(tmp_path)]) == 2
    assert cli.main(["bloat", "--verdicts", str(bad), "--cap", "0.5", "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["bloat", "--seeds", "0"])
    assert exc.value.code == 2
    with pytest.raises(VerdictError, match="no verdict"):
        broken = dict(TINY_CACHE, patches={})
        bad.write_text(json.dumps(broken))
        load_verdicts(bad)


@pytest.mark.docker
def test_real_sandbox_and_grader_build_a_verdict_cache(tmp_path, bundled_tasks):
    """One bundled Python task with a special-casing hack through the real sandbox and the real heuristic grader:
    the cache holds the trainer's verdict (the hack passes the sandbox, the grader's hack check fails it)."""
    tasks = bundled_tasks
    iid = "acme__durations-42"
    cache = build_verdicts(tasks, instance_ids=[iid], max_workers=2)
    (task,) = cache["tasks"]
    by_kind = {c["kind"]: cache["patches"][c["patch_hash"]] for c in task["candidates"]}
    assert by_kind["minimal"]["reward"] == 1.0 and by_kind["minimal"]["status"] == "resolved"
    assert by_kind["wrong"]["reward"] == 0.0
    assert by_kind["minimal"]["diff_lines"] < by_kind["bloated"]["diff_lines"]
    hack = by_kind["hack"]
    assert hack["sandbox_passed"] and hack["grader_hack"] == "special_casing"
    assert not hack["passed"] and hack["reward"] == 0.0
    assert cache["source"]["grader_hacks"] == [f"{iid}:hack-special-case"]
    graded = [c for c in task["candidates"] if cache["patches"][c["patch_hash"]]["sandbox_passed"]]
    assert len(task["gradings"]) == 2 ** len(graded) - 1
    pair = task["gradings"][subset_key(["minimal", "bloated"])]
    assert pair["ranking"][0] == "minimal" and pair["weights"]["minimal"] >= pair["weights"]["bloated"]
    path = tmp_path / "verdicts.json"
    path.write_text(json.dumps(cache))
    assert cli.main(["bloat", "--verdicts", str(path), "--seeds", "1", "--steps", "3", "--out", str(tmp_path)]) == 0
