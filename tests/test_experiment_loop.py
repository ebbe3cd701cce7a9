"""`gagar experiment loop --quick`: the real train path per arm, the result file's shape, and a control arm
(learning rate 0) that leaves the policy's weights exactly where the warm start put them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.experiments.cli import main
from trainer.experiments.loop import METRICS, quality_labels

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _adapter(run: Path) -> dict[str, torch.Tensor]:
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    assert ckpts, f"no checkpoint in {run}"
    return load_file(str(ckpts[-1] / "weights" / "adapter_model.safetensors"))


def test_quick_loop_experiment(bundled_tasks: Path, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    rc = main(["loop", "--quick", "--arms", "grpo+gagar,control", "--out", str(out), "--work", str(work),
               "--tasks-dir", str(bundled_tasks), "--set", f"model.cache_dir={tmp_path / 'models'}"])
    assert rc == 0
    result = json.loads((out / "loop-quick.json").read_text())
    assert (out / "loop-quick.png").stat().st_size > 10_000
    assert result["seeds"] == 1 and result["steps"] == 2
    assert set(result["results"]) == {"grpo+gagar", "control"}
    for arm, data in result["results"].items():
        assert set(data["curves"]) == set(METRICS), arm
        for m in METRICS:
            assert len(data["curves"][m]) == 2
        rows = result["per_seed"][arm][0]["steps"]
        assert [r["step"] for r in rows] == [1, 2]
        assert all(r["pass_rate"] is not None and 0.0 <= r["pass_rate"] <= 1.0 for r in rows)

    # lr = 0: every LoRA B matrix is still PEFT's zero initialisation after the RL steps.
    control = _adapter(work / "loop-quick" / "control-seed0")
    lora_b = {k: v for k, v in control.items() if "lora_B" in k}
    assert lora_b and all(torch.count_nonzero(v) == 0 for v in lora_b.values())
    # The learning arm moved them whenever a step trained on anything (same seed, same warm start).
    metrics = [json.loads(ln) for ln in (work / "loop-quick" / "grpo+gagar-seed0" / "metrics.jsonl")
               .read_text().splitlines() if ln.strip()]
    if any(r.get("groups_kept") for r in metrics):
        learned = _adapter(work / "loop-quick" / "grpo+gagar-seed0")
        assert any(torch.count_nonzero(v) > 0 for k, v in learned.items() if "lora_B" in k)


def test_quality_labels_match_bundled_patches(bundled_tasks: Path) -> None:
    labels = quality_labels(bundled_tasks)
    kinds = set(labels.values())
    assert {"minimal", "gold", "bloated"} <= kinds
    # every bundled task has its minimal patch labelled, keyed by its instance
    instances = {json.loads(ln)["instance_id"] for ln in (bundled_tasks / "instances.jsonl").read_text().splitlines()
                 if ln.strip()}
    assert instances == {iid for (iid, _), k in labels.items() if k == "minimal"}


def test_bad_arm_is_a_clear_error(bundled_tasks: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["loop", "--arms", "grpo,sparkle", "--out", str(tmp_path), "--tasks-dir", str(bundled_tasks)])
    assert rc == 2
    assert "unknown arm(s) sparkle" in capsys.readouterr().err
