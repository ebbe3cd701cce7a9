"""Scale-out pieces on the local engine: the sandbox pool split over several Docker hosts (here the same local
engine named twice, which exercises the split, the per-host `gagar eval` runs and the merge), and the verl
recipe's batch reward function (called directly; verl itself is not installed here)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from trainer_fixtures import ROOT, bundled_tasks

from sandbox.records import Instance, Prediction
from trainer.config import SandboxSection
from trainer.sandbox_pool import SandboxPool

TASKS = ["acme__iniconf-9", "acme__durations-42"]


def _load(tasks: Path):
    insts = {d["instance_id"]: Instance.from_dict(d) for d in map(json.loads, (tasks / "instances.jsonl").open())}
    preds = [d for d in map(json.loads, (tasks / "predictions.jsonl").open()) if d["instance_id"] in TASKS]
    expected = {(d["instance_id"], str(d["rollout_id"])): d for d in map(json.loads, (tasks / "expected.jsonl").open())}
    return insts, preds, expected


@pytest.mark.docker
def test_pool_spreads_groups_over_hosts(tmp_path_factory, tmp_path):
    tasks = bundled_tasks(tmp_path_factory)
    insts, preds, expected = _load(tasks)
    preds = [p for p in preds if p["rollout_id"] in {"minimal", "gold", "tamper"}]
    local = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    pool = SandboxPool(SandboxSection(docker_hosts=[local, local], max_workers=2, timeout=120), tasks / "repos")
    res = pool.evaluate(insts, [Prediction(p["instance_id"], p["model_patch"], "bundled", str(p["rollout_id"]))
                                for p in preds], tmp_path)
    assert len(res) == len(preds)
    for r in res:
        assert r.status == expected[(r.instance_id, r.rollout_id)]["status"], (r.key, r.error)
    # Whole groups per host: each host's run holds exactly one instance.
    per_host = [{json.loads(ln)["instance_id"] for ln in (tmp_path / f"host{i}" / "predictions.jsonl").open()}
                for i in range(2)]
    assert sorted(len(s) for s in per_host) == [1, 1] and per_host[0] != per_host[1]


@pytest.mark.docker
def test_verl_reward_scores_and_grades_a_batch(tmp_path_factory, monkeypatch):
    tasks = bundled_tasks(tmp_path_factory)
    _, preds, expected = _load(tasks)
    batch = [p for p in preds if p["instance_id"] == "acme__iniconf-9" and p["rollout_id"] in
             {"minimal", "bloated", "gold", "tamper"}]
    monkeypatch.setenv("GAGAR_TASKS_DIR", str(tasks))
    import importlib.util

    spec = importlib.util.spec_from_file_location("gagar_verl_reward", ROOT / "recipes" / "verl" / "reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    out = reward.compute_score(["gagar_swe"] * len(batch), ["Fix:\n```diff\n" + p["model_patch"] + "```" for p in batch],
                               [p["instance_id"] for p in batch], [{} for _ in batch])
    for p, o in zip(batch, out, strict=True):
        exp = expected[(p["instance_id"], p["rollout_id"])]
        assert o["score"] == (1.0 if exp["resolved"] else 0.0) and o["gagar_hacked"] == exp["tampered_tests"]
        # Passing patches got a grader weight in (0, 1]; failing ones none (NaN = not graded).
        assert (0 < o["gagar_weight"] <= 1) if exp["resolved"] else math.isnan(o["gagar_weight"])
    weights = {p["rollout_id"]: o["gagar_weight"] for p, o in zip(batch, out, strict=True)}
    assert weights["minimal"] >= weights["bloated"]
