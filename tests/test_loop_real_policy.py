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
