"""The loop experiment on the real policy (issue 38): the control arm's update is skipped exactly (lr 0 changes
nothing), and the experiment's records."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import trainer.loop
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_a_zero_learning_rate_skips_the_update(monkeypatch) -> None:
    """lr 0 (the control arm) leaves every weight as it is, so the forward and backward passes are skipped; any
    other lr runs them."""
    calls = []
    monkeypatch.setattr(trainer.loop, "policy_update", lambda *a, **k: calls.append(k["lr"]) or {"loss": 0.0})
    for lr, skipped in ((0.0, True), (1e-4, False)):
        cfg = load_config(ROOT / "configs" / "loop_real.yaml", [f"optim.lr={lr}"])
        policy = SimpleNamespace(model=None, optimizer=None, pad_id=0, ref_model=None)
        stats = trainer.loop.Trainer.update(SimpleNamespace(cfg=cfg, policy=policy), [], torch.zeros(0, 0), 1)
        assert stats.get("update_skipped") == (1 if skipped else None)
    assert calls == [pytest.approx(1e-4)]


def test_contrasts_say_what_differs_beyond_the_seed_spread() -> None:
    """A difference larger than twice its standard error over seeds is beyond the spread; a smaller one, or one
    measured on a single seed each with zero spread but no difference, is not."""
    from trainer.experiments.loop import _stats, contrast, contrasts

    far = contrast(_stats([0.5, 0.52, 0.48]), _stats([0.1, 0.12, 0.08]))
    assert far["beyond_spread"] and far["diff"] == pytest.approx(0.4)
    near = contrast(_stats([0.5, 0.7, 0.3]), _stats([0.4, 0.6, 0.2]))
    assert not near["beyond_spread"] and near["se"] > 0
    assert contrast(_stats([None, None]), _stats([0.1])) is None
    assert not contrast(_stats([0.2]), _stats([0.2]))["beyond_spread"]
    results = {arm: {"final": {"pass_rate": _stats(v)}, "heldout": None}
               for arm, v in {"grpo": [0.3, 0.32, 0.31], "grpo+gagar": [0.3, 0.35, 0.25], "control": [0.1] * 3}.items()}
    table = contrasts(results, 4)
    assert set(table) == {"grpo+gagar - grpo", "control - grpo", "grpo - control", "grpo+gagar - control"}
    assert table["grpo - control"]["train.pass_rate"]["beyond_spread"]
    assert not table["grpo+gagar - grpo"]["train.pass_rate"]["beyond_spread"]


def test_the_estimate_counts_a_shared_warm_start_and_frontier_once(tmp_path: Path) -> None:
    """The estimate printed first: answers per step × steps × unfinished runs, plus the mutation warm start and the
    frontier estimate once (every seed and arm shares them), plus greedy + k held-out answers per task and run.
    Before, the warm start was counted once per seed, the frontier not at all, and a step cost the same whatever
    its number of answers."""
    import json

    from trainer.experiments.loop import TIMING, LoopExperiment

    exp = LoopExperiment(config=ROOT / "configs" / "loop_real.yaml", arms=["grpo", "control"], seeds=3, steps=2,
                         work=tmp_path, tasks_dir=None, heldout_split="heldout", heldout_tasks=4, heldout_k=2)
    done = exp.run_dir("grpo", 0)
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"steps": 2}))
    t, est = TIMING["smol"], exp.estimate_s()
    assert est["steps"] == pytest.approx(5 * 2 * 4 * 8 * t["answer_s"])  # 5 runs left, 4 tasks × 8 answers a step
    assert est["warm_start"] == pytest.approx(t["warm_s"])
    assert est["frontier"] == pytest.approx(252 * 8 * t["sample_s"])
    assert est["heldout"] == pytest.approx(5 * 4 * 3 * t["sample_s"])
    assert est["total"] == pytest.approx(sum(v for k, v in est.items() if k != "total"))
