"""Plumbing of the judge's learning path, with a tiny random model standing in (sft/tiny.py; never the product's
judge): a from-scratch model trained on a handful of groups until its answer is exact, then `gagar grade --judge
llm` with that model returns exactly the known rankings — its own answers, with no heuristic fallback. The
product's judge is SmolLM2-135M-Instruct with a LoRA adapter (`make judge`: held-out repositories; not in CI)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from grader.cli import main as grade_main
from grader.records import read_jsonl
from sft.cli import main as sft_main


def _data(tasks: Path, out: Path) -> None:
    rc = sft_main([
        "data", "--instances", str(tasks / "instances.jsonl"), "--repos-dir", str(tasks / "repos"),
        "--out", str(out), "--max-instances", "2", "--variants", "2", "--groups-per-instance", "1",
        "--val-fraction", "0", "--inspect", "none", "--cite", "findings", "--shuffles", "1",
    ])
    assert rc == 0


def _train(data: Path, base: Path) -> dict:
    cfg = {
        "tiny_model": {"out_dir": str(base / "base"), "hidden_size": 128, "num_layers": 2, "num_heads": 4,
                       "vocab_size": 2048, "max_positions": 2048, "corpus": str(data / "train.jsonl")},
        "data": {"train": str(data / "train.jsonl"), "val": None},
        "output_dir": str(base / "run"),
        "export_dir": str(base / "judge"),
        "lora": {"enabled": False},
        "training": {"epochs": 1, "max_steps": 150, "learning_rate": 5e-3, "batch_size": 2,
                     "gradient_accumulation_steps": 1, "max_length": 2048, "warmup_ratio": 0.0,
                     "lr_scheduler": "cosine", "logging_steps": 10, "save_strategy": "no", "repeat": 200},
        "eval": {"ranking": False},
    }
    path = base / "overfit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert sft_main(["train", "--config", str(path)]) == 0
    return json.loads((base / "run" / "sft_summary.json").read_text())


def test_overfit_judge_grades_exactly(bundled_tasks, tmp_path):
    data = tmp_path / "data"
    _data(bundled_tasks, data)
    summary = _train(data, tmp_path)
    assert summary["full_weights"] and summary["exported"] == str(tmp_path / "judge")
    assert summary["loss_curve"][-1][1] < 0.2, summary["loss_curve"]

    out = tmp_path / "graded.jsonl"
    rc = grade_main(["--groups", str(data / "groups.jsonl"), "--repos-dir", str(bundled_tasks / "repos"),
                     "--out", str(out), "--judge", "llm", "--model", str(tmp_path / "judge"),
                     "--max-new-tokens", "256", "--max-turns", "2", "--no-progress"])
    assert rc == 0
    gold = {r["instance_id"]: r for r in read_jsonl(data / "labels.jsonl")}
    rows = read_jsonl(out)
    assert len(rows) == len(gold) >= 2
    for r in rows:
        assert r["judge"] == "llm:judge" and r["fallback"] is False, r
        assert r["ranking"] == gold[r["instance_id"]]["order"], r
        assert r["tiers"] == gold[r["instance_id"]]["tiers"], r
