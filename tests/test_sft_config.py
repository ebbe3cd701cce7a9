"""`gagar sft train`'s config: the same declarative schema as `gagar train` (gagar.schema), checked in full when
the file loads — before a model is built — with every message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sft.cli import main as sft_main

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, section: str | None, key: str, value) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "sft_tiny.yaml").read_text())
    cfg["output_dir"] = str(tmp_path / "run")
    cfg["tiny_model"]["out_dir"] = str(tmp_path / "tiny")
    (cfg[section] if section else cfg)[key] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("section, key, value, words", [
    ("training", "learning_rate", "fast", "training.learning_rate: expected a number, got 'fast'"),
    ("training", "bf16", "maybe", "training.bf16: expected one of auto or true/false, got 'maybe'"),
    ("training", "save_strategy", False, "training.save_strategy must be one of no, epoch or steps"),
    ("training", "max_steps", 1.5, "training.max_steps: expected an integer, got 1.5"),
    ("training", "epochs", True, "training.epochs: expected a number, got True"),
    ("lora", "r", 0, "lora.r must be >= 1, got 0"),
    ("lora", "rank", 8, "lora: unknown key(s) rank; allowed: alpha, dropout, enabled, layers, r, target_modules"),
    ("lora", "layers", "29-15", "lora.layers must be a list of layer indexes or 'A-B', got '29-15'"),
    ("training", "max_minutes", 0, "training.max_minutes must be > 0.0, got 0"),
    ("eval", "ranking", "sometimes", "eval.ranking: expected true/false, got 'sometimes'"),
    (None, "model", "some/model", "give exactly one of `model` (hub id or path) and `tiny_model`"),
])
def test_a_bad_value_names_its_key_before_anything_is_built(tmp_path, capsys, section, key, value, words) -> None:
    rc = sft_main(["train", "--config", str(_config(tmp_path, section, key, value))])
    err = capsys.readouterr().err
    assert rc == 2 and words in err, err
    assert not (tmp_path / "tiny").exists() and not (tmp_path / "run").exists()


def test_the_shipped_configs_load_and_command_line_overrides_are_checked_too(tmp_path) -> None:
    from gagar.schema import ConfigError
    from sft.train import load_config

    for name in ("sft_tiny.yaml", "sft_gpu.yaml", "judge_cpu.yaml", "judge_score.yaml"):
        cfg = load_config(ROOT / "configs" / name)
        assert cfg["data"]["train"] and cfg["output_dir"]
    assert load_config(ROOT / "configs" / "judge_cpu.yaml")["training"]["save_strategy"] == "no"
    cfg = load_config(ROOT / "configs" / "sft_tiny.yaml", {"training": {"max_steps": 3}, "output_dir": "o"})
    assert cfg["training"]["max_steps"] == 3 and cfg["output_dir"] == "o" and cfg["training"]["epochs"] == 2
    with pytest.raises(ConfigError, match="training.max_steps must be >= -1"):
        load_config(ROOT / "configs" / "sft_tiny.yaml", {"training": {"max_steps": -5}})
