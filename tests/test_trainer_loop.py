"""`gagar train --config configs/tiny.yaml` end to end: real Docker sandbox, real grader and advantage engine, real
LoRA updates; then `--resume` from the checkpoint. Also the config loader's errors. The policy is the tiny RANDOM
model (sft.tiny), which only checks the loop's plumbing in seconds; the pretrained policy (configs/smol.yaml,
SmolLM2-135M-Instruct) is exercised by test_smol_smoke.py and measured by `make demo-smol`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_fixtures import CONFIG, bundled_tasks, model_cache

from trainer.cli import main
from trainer.config import ConfigError, load_config


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return bundled_tasks(tmp_path_factory)


def _lora_b(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = load_file(str(ckpt / "weights" / "adapter_model.safetensors"))
    return {k: v for k, v in state.items() if "lora_B" in k}


def _rows(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


@pytest.mark.docker
@pytest.mark.slow
def test_tiny_config_trains_two_steps_and_resumes(tasks, tmp_path, tmp_path_factory, capsys):
    out = tmp_path / "run"
    models = model_cache(tmp_path_factory)
    common = ["--config", str(CONFIG), "--out", str(out), "--set", f"tasks.dir={tasks}",
              "--set", f"model.cache_dir={models}", "--set", "tensorboard=false"]
    assert main([*common, "--steps", "2"]) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollouts"] >= 8 and 0.0 <= r["pass_rate"] <= 1.0 for r in rows)
    # The warm-started policy's groups mix passing and failing patches, so the update really ran...
    updated = [r for r in rows if r["groups_kept"] > 0]
    assert updated and all("loss" in r and "clip_frac" in r for r in updated)
    # ...and moved the trainable weights: LoRA's B matrices start at exactly zero.
    ckpt = out / "checkpoints" / "step_000002"
    assert (ckpt / "state.json").is_file() and (ckpt / "optimizer.pt").is_file()
    assert any(float(v.abs().sum()) > 0 for v in _lora_b(ckpt).values())
    assert (out / "plots" / "curves.png").stat().st_size > 10_000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint"].endswith("step_000002")

    from trainer.loop import Trainer

    cfg = load_config(CONFIG, [f"out={out}", f"tasks.dir={tasks}", f"model.cache_dir={models}",
                               "tensorboard=false", "steps=3"])
    trainer = Trainer(cfg, resume=True)
    assert trainer.start_step == 2
    # The resumed policy holds exactly the checkpoint's adapter (not a fresh zero-initialised one).
    live = {k: v for k, v in trainer.policy.model.state_dict().items() if "lora_B" in k}
    saved = _lora_b(ckpt)
    assert len(live) == len(saved) > 0
    assert sorted(float(v.abs().sum()) for v in live.values()) == pytest.approx(
        sorted(float(v.abs().sum()) for v in saved.values()))
    trainer.run()
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]
    assert json.loads((out / "checkpoints" / "step_000003" / "state.json").read_text())["step"] == 3
    assert main([*common, "--steps", "3", "--resume"]) == 0  # nothing left to do: a no-op, not a restart
    assert "resumed from" in capsys.readouterr().out and len(_rows(out)) == 3


def test_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lerning_rate: 0.1\n")
    with pytest.raises(ConfigError, match="optim: unknown key.*lerning_rate"):
        load_config(bad)
    bad.write_text("rollout:\n  n: lots\n")
    with pytest.raises(ConfigError, match="rollout.n: expected an integer"):
        load_config(bad)
    with pytest.raises(ConfigError, match="advantage.mode must be one of"):
        load_config(CONFIG, ["advantage.mode=gapo+magic"])
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    cfg = load_config(CONFIG, ["rollout.n=6", "advantage.mode=grpo+downweight"])
    assert cfg.rollout.n == 6 and cfg.advantage.estimator == "grpo" and cfg.advantage.redistribution == "downweight"
    assert main(["--config", str(bad)]) == 2


@pytest.mark.parametrize("override, message", [
    ("advantage.cap=0.5", "advantage.cap must be >= 1"),
    ("advantage.eps=0", "advantage.eps must be > 0"),
    ("advantage.coverage=1.5", "advantage.coverage must be <= 1"),
    ("rollout.temperature=0", "rollout.temperature must be > 0"),
    ("rollout.top_p=0", "rollout.top_p must be > 0"),
    ("optim.lr=true", "optim.lr: expected a number"),
    ("optim.minibatch_size=0", "optim.minibatch_size must be >= 1"),
    ("grader.permutations=0", "grader.permutations must be >= 1"),
    ("lora.target_modules=5", "lora.target_modules: expected a list"),
    ("rollout.backend=openai", "rollout.backend=openai needs rollout.base_url"),
])
def test_every_config_error_surfaces_at_load_naming_the_key(override, message, capsys):
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        load_config(CONFIG, [override])
    # The CLI stops with exit 2 before any model is built or warm-started (no set-up output at all).
    assert main(["--config", str(CONFIG), "--set", override]) == 2
    err = capsys.readouterr()
    assert message.split(" ")[0] in err.err and "warm start" not in err.out
