"""gagar sft train / eval on CPU with the tiny model: loss falls on a repeated set, the adapter reloads and
generates, a run resumes from its checkpoint, and `gagar sft eval` prints the judge and heuristic rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sft.cli import main as sft_main
from sft.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, bundled_tasks):
    base = tmp_path_factory.mktemp("sfttrain")
    tasks = bundled_tasks
    data = base / "data"
    # One short variant per group keeps the records ~2k tokens: the CPU steps stay fast.
    assert (
        sft_main(
            [
                "data",
                "--instances",
                str(tasks / "instances.jsonl"),
                "--repos-dir",
                str(tasks / "repos"),
                "--out",
                str(data),
                "--variants",
                "1",
                "--groups-per-instance",
                "1",
                "--max-instances",
                "3",
                "--val-fraction",
                "0.34",
            ]
        )
        == 0
    )
    model = build_tiny_model(base / "tiny")
    train_rows = (data / "train.jsonl").read_text().splitlines()
    (data / "one.jsonl").write_text(train_rows[0] + "\n")
    return {"base": base, "tasks": tasks, "data": data, "model": model}


def _config(setup, out: Path, **training) -> Path:
    cfg = {
        "model": str(setup["model"]),
        "data": {"train": str(setup["data"] / "one.jsonl"), "val": str(setup["data"] / "val.jsonl")},
        "output_dir": str(out),
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
        "training": {
            "epochs": 1,
            "learning_rate": 1e-2,
            "batch_size": 1,
            "gradient_accumulation_steps": 1,
            "max_length": 4096,
            "warmup_ratio": 0.0,
            "lr_scheduler": "constant",
            "logging_steps": 1,
            "save_strategy": "steps",
            "save_steps": 3,
            "save_total_limit": 3,
            "repeat": 8,
            **training,
        },
        "eval": {"ranking": True, "max_groups": 1, "max_new_tokens": 4},
        "merge": False,
    }
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_loss_falls_adapter_reloads_and_resume(setup, capsys):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = setup["base"] / "run"
    cfg = _config(setup, out, max_steps=6)
    assert sft_main(["train", "--config", str(cfg)]) == 0
    summary = json.loads((out / "sft_summary.json").read_text())
    losses = [loss for _, loss in summary["loss_curve"]]
    assert summary["global_step"] == 6 and len(losses) == 6
    assert losses[-1] < losses[0] - 0.1 and min(losses[3:]) < min(losses[:2]), f"loss did not fall: {losses}"
    # Ranking metrics are logged next to the loss at evaluation.
    ev = summary["eval"][-1]
    assert {"eval_loss", "eval_top1", "eval_pairwise_accuracy", "eval_kendall_tau", "eval_parse_rate"} <= set(
        ev
    )

    tok = AutoTokenizer.from_pretrained(out / "adapter")
    base = AutoModelForCausalLM.from_pretrained(setup["model"])
    model = PeftModel.from_pretrained(base, str(out / "adapter"))
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b), "adapter weights were not trained"
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "rank"}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > enc["input_ids"].shape[1]

    # Resume: the next run continues from checkpoint-6 instead of starting over.
    cfg2 = _config(setup, out, max_steps=8)
    assert sft_main(["train", "--config", str(cfg2), "--resume"]) == 0
    summary2 = json.loads((out / "sft_summary.json").read_text())
    assert summary2["resumed_from"].endswith("checkpoint-6")
    assert summary2["global_step"] == 8
    assert [s for s, _ in summary2["loss_curve"]][-2:] == [7, 8]


def test_eval_prints_judge_and_heuristic(setup, capsys):
    data = setup["data"]
    rc = sft_main(
        [
            "eval",
            "--groups",
            str(data / "val_groups.jsonl"),
            "--labels",
            str(data / "val_labels.jsonl"),
            "--repos-dir",
            str(setup["tasks"] / "repos"),
            "--model",
            str(setup["model"]),
            "--max-new-tokens",
            "8",
            "--max-turns",
            "1",
            "--json",
            str(setup["base"] / "eval.json"),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "heuristic" in text and "judge" in text and "Kendall" in text
    rows = json.loads((setup["base"] / "eval.json").read_text())
    assert [r["ranker"].split()[0] for r in rows] == ["heuristic", "judge", "judge+fallback"]
    # An untrained random model cannot produce a usable answer: the parse rate says so instead of hiding it.
    # (A trained judge's own answers are proven in tests/test_sft_judge.py.)
    assert rows[1]["parse_rate"] == 0.0 and rows[0]["instances"] == rows[1]["instances"] >= 1
    assert rows[1]["grammar_rate"] == 1.0  # its answers were all decoded in the grammar, and say so


def test_bad_config_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\ndata: {train: t.jsonl}\noutput_dir: o\ntraining: {epochz: 1}\n")
    assert sft_main(["train", "--config", str(bad)]) == 2
    assert "epochz" in capsys.readouterr().err
    assert sft_main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    ok = tmp_path / "ok.yaml"
    ok.write_text("model: x\ndata: {train: t.jsonl}\noutput_dir: o\ntraining: {max_minutes: 55}\n")
    assert sft_main(["train", "--config", str(ok), "--max-minutes", "0"]) == 2  # the override is validated too
    assert "training.max_minutes must be > 0" in capsys.readouterr().err


def test_lora_layer_ranges_and_a_bad_one_exits_2(tmp_path, capsys):
    from sft.train import _layer_range

    assert _layer_range(None) is None and _layer_range("all") is None
    assert _layer_range("15-17") == [15, 16, 17] and _layer_range([3, 5]) == [3, 5]
    bad = tmp_path / "bad_layers.yaml"
    bad.write_text("model: x\ndata: {train: t.jsonl}\noutput_dir: o\nlora: {layers: '9-3'}\n")
    assert sft_main(["train", "--config", str(bad)]) == 2
    assert "lora.layers" in capsys.readouterr().err


def test_fit_schedule_ends_the_cosine_where_the_shortened_run_ends():
    import torch
    from transformers import get_constant_schedule, get_cosine_schedule_with_warmup

    from sft.clock import fit_schedule

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=100)
    for _ in range(10):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] > 0.9  # still near the top of a 100-step cosine
    assert fit_schedule(sched, 20)
    for _ in range(10):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(0.0, abs=1e-9)  # the shortened cosine has reached its end
    assert not fit_schedule(get_constant_schedule(opt), 20)  # no horizon to move: the caller keeps the plan


def _run_clock(monkeypatch, start: int) -> tuple:
    """sft.train's clock over a 100-step cosine run begun (or resumed) at `start`, 10 s a step, a 2-minute budget:
    (the callback, the trainer state, the schedule) where it stopped."""
    import time
    from types import SimpleNamespace

    import torch
    from transformers import get_cosine_schedule_with_warmup

    from sft.clock import clock_callback

    clock = {"t": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=100)
    for _ in range(start):  # the steps a resumed run's checkpoint already took
        opt.step()
        sched.step()
    cb = clock_callback(max_minutes=2.0)
    state, control = SimpleNamespace(global_step=start, max_steps=100), SimpleNamespace(should_training_stop=False)
    cb.on_train_begin(None, state, control)
    for step in range(start + 1, 101):
        clock["t"] = 10.0 * (step - start)
        state.global_step = step
        opt.step()
        sched.step()
        cb.on_step_end(None, state, control, lr_scheduler=sched)
        if control.should_training_stop:
            break
    return cb, state, sched


def test_time_budget_shortens_the_run_after_measuring_it(monkeypatch, capsys):
    cb, state, sched = _run_clock(monkeypatch, 0)
    # After 8 steps (80 s) the remaining 40 s fit 4 more: the run and its cosine end at step 12.
    assert cb.fitted_steps == 12 and state.global_step == 12 and not cb.stopped_at_cap
    assert sched.get_last_lr()[0] == pytest.approx(0.0, abs=1e-9)
    assert "10.0 s/step: about 17 min for 100 steps" in capsys.readouterr().out


def test_clock_fits_a_resumed_run(monkeypatch, capsys) -> None:
    """A run resumed at step 60 measures its own first steps and fits the rest of its budget (before the fix the
    fit waited for global step 8, which a resumed run never reaches: it ran on to the cap, its cosine cut off)."""
    cb, state, sched = _run_clock(monkeypatch, 60)
    assert cb.fitted_steps == 72 and state.global_step == 72 and not cb.stopped_at_cap
    assert sched.get_last_lr()[0] == pytest.approx(0.0, abs=1e-9)
    assert "10.0 s/step: about 7 min for 40 steps" in capsys.readouterr().out
