"""`gagar sft train --config FILE.yaml` (or `python -m sft.train --config FILE.yaml`): LoRA SFT of the judge.

TRL `SFTTrainer` + PEFT `LoraConfig`, loss on the assistant turns only (tool calls and the final answer; the
prompt, tool results and workspace summary are context). Every epoch the validation split is scored twice:
the loss, and the ranking metrics of the answer the model writes after the expert's inspection turns
(answer-step evaluation: top-1, pairwise accuracy, Kendall tau, parse rate), logged side by side. The adapter
is saved to OUTPUT/adapter (and the merged model to OUTPUT/merged with `merge: true`); checkpoints go to
OUTPUT/checkpoint-*, and `resume_from_checkpoint: true` (or `--resume`) continues from the last one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gagar.args import ArgumentParser
from gagar.schema import ConfigError, Section, read_yaml, validate
from sft.evaluate import answer_step_metrics

__all__ = ["ConfigError", "SftConfig", "load_config", "train"]


class TinyModelSection(Section):
    """A random compact Qwen2 built on the spot (`sft.tiny.build_tiny_model`), for CPU runs and tests."""

    out_dir: str | None = None  # default: OUTPUT_DIR/tiny-base
    seed: int = 0
    hidden_size: int = Field(64, ge=16)
    num_layers: int = Field(2, ge=1)
    vocab_size: int = Field(4096, ge=512)
    num_heads: int | None = Field(None, ge=1)
    num_kv_heads: int | None = Field(None, ge=1)
    intermediate_size: int | None = Field(None, ge=1)
    max_positions: int | None = Field(None, ge=16)
    corpus: str | None = None  # chat records whose texts the tokenizer's merges are fit to


class DataSection(Section):
    train: str
    val: str | None = None


class LoraSection(Section):
    enabled: bool = True  # false: every weight is trained (a from-scratch model has nothing to adapt)
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"
    layers: str | list[int] | None = None  # e.g. "15-29": adapt only those decoder layers (the rest: no backward)

    @field_validator("layers")
    @classmethod
    def _layers(cls, v: str | list[int] | None) -> str | list[int] | None:
        _layer_range(v)  # a bad range is refused when the config loads, not after the model has
        return v


class TrainingSection(Section):
    epochs: float = Field(2, gt=0)
    max_steps: int = Field(-1, ge=-1)  # -1: epochs decide
    learning_rate: float = Field(1e-4, gt=0)
    batch_size: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(8, ge=1)
    max_length: int = Field(8192, ge=1)
    packing: bool = False
    warmup_ratio: float = Field(0.03, ge=0, le=1)
    weight_decay: float = Field(0.0, ge=0)
    lr_scheduler: str = "cosine"
    logging_steps: int = Field(5, ge=1)
    save_strategy: Literal["no", "epoch", "steps"] = "epoch"  # quote "no" in YAML (bare no is false)
    save_steps: int = Field(500, ge=1)
    save_total_limit: int | None = Field(2, ge=0)  # 0 / null: keep every checkpoint
    seed: int = 0
    repeat: int = Field(1, ge=1)  # passes over the training records per epoch
    gradient_checkpointing: Literal["auto"] | bool = "auto"  # auto: on GPU only
    bf16: Literal["auto"] | bool = "auto"
    # group_by_length: batches of similar length waste less compute on padding
    sampling: Literal["random", "group_by_length"] = "random"
    max_minutes: float | None = Field(None, gt=0)  # a time cap: training stops there, whatever max_steps says


class EvalSection(Section):
    ranking: bool = True  # the judge's ranking metrics next to the loss, every epoch
    max_groups: int = Field(32, ge=1)
    max_new_tokens: int = Field(512, ge=1)


class SftConfig(Section):
    model: str | None = None  # hub id or local path (or give tiny_model)
    tiny_model: TinyModelSection | None = None
    data: DataSection
    output_dir: str
    lora: LoraSection = Field(default_factory=LoraSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    merge: bool = False
    export_dir: str | None = None
    resume_from_checkpoint: bool | str | None = None

    @model_validator(mode="after")
    def _one_model(self) -> SftConfig:
        if bool(self.model) == (self.tiny_model is not None):
            raise ValueError("give exactly one of `model` (hub id or path) and `tiny_model` (a mapping)")
        return self


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config at `path` (with `overrides` merged in, e.g. from the command line), checked in full against
    `SftConfig` — unknown keys, types, ranges; every message names the key — as a plain dict for `train`."""
    try:
        return validate(SftConfig, _merge(read_yaml(path), overrides or {})).model_dump()
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def read_records(path: str | Path) -> list[dict[str, Any]]:
    from grader.records import read_jsonl

    rows = read_jsonl(path)
    for i, r in enumerate(rows, 1):
        if not isinstance(r.get("messages"), list) or not r["messages"]:
            raise ConfigError(f"{path}: record {i} has no `messages` list (build data with `gagar sft data`)")
    return rows


def _fits(tokenizer: Any, records: list[dict[str, Any]], max_length: int) -> tuple[list[dict[str, Any]], int]:
    """Records whose whole conversation fits: truncation would cut the final answer, the part that matters."""
    keep = []
    for r in records:
        ids = tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"]
        if len(ids) <= max_length:
            keep.append(r)
    return keep, len(records) - len(keep)


def _layer_range(spec: Any) -> list[int] | None:
    """`lora.layers`: None (all), a list of layer indexes, or "A-B" (inclusive)."""
    if spec in (None, "", "all"):
        return None
    if isinstance(spec, list) and all(isinstance(i, int) for i in spec):
        return spec
    parts = str(spec).split("-")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts) and int(parts[0]) <= int(parts[1]):
        return list(range(int(parts[0]), int(parts[1]) + 1))
    raise ConfigError(f"lora.layers must be a list of layer indexes or 'A-B', got {spec!r}")


def _resolve_model(cfg: dict[str, Any]) -> str:
    if cfg["model"]:
        model = str(cfg["model"])
        local = Path(model).expanduser()
        # Hub ids never start with / . or ~: such a value is a path, and a missing one would otherwise fail
        # later with a confusing "repo id" message from the hub client.
        if model.startswith((".", "/", "~")) and not local.exists():
            raise ConfigError(
                f"model path {model} does not exist (give a hub id like owner/name or a local dir)"
            )
        if local.exists():
            return str(local)
        from inference.models import resolve_model

        return resolve_model(model)  # a registry name (`gagar model pull NAME`): pulled on first use
    from sft.tiny import build_tiny_model

    tiny = dict(cfg["tiny_model"])
    out = tiny.pop("out_dir", None) or os.path.join(str(cfg["output_dir"]), "tiny-base")
    return str(build_tiny_model(out, **tiny))


def _fit_schedule(scheduler: Any, steps: int) -> bool:
    """Give a transformers LambdaLR schedule (cosine, linear, ...) a new horizon of `steps`; False if it has none."""
    import functools

    lambdas = getattr(scheduler, "lr_lambdas", None) or []
    fits = [f for f in lambdas if isinstance(f, functools.partial) and "num_training_steps" in f.keywords]
    if not fits or len(fits) != len(lambdas):
        return False
    scheduler.lr_lambdas = [functools.partial(f.func, *f.args, **{**f.keywords, "num_training_steps": steps})
                            for f in fits]
    return True


def _clock_callback(max_minutes: float | None, measure_steps: int = 8) -> Any:
    """The time budget: after `measure_steps` optimizer steps it prints the estimate, and if the run would pass
    `max_minutes` it shortens it to the steps that fit, learning-rate schedule included (a cosine that ends where
    the run ends, not one cut off at full height); it also stops at the cap itself. Steps count from where this
    process began: a run resumed from a checkpoint measures and fits its own steps."""
    import time

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = self.t_first = 0.0
            self.start_step = 0
            self.stopped_at_cap = False
            self.planned_steps: int | None = None
            self.fitted_steps: int | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()
            self.planned_steps = state.max_steps
            self.start_step = state.global_step  # > 0 when resumed from a checkpoint

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            spent = now - self.t0
            done = state.global_step - self.start_step
            if done == 1:
                self.t_first = now  # the first step pays for warm-up (allocations, kernels): not a fair sample
            if done == measure_steps:
                per = (now - self.t_first) / (measure_steps - 1)
                total = state.max_steps
                left = total - self.start_step
                print(f"gagar sft train: {per:.1f} s/step: about {per * left / 60:.0f} min for {left} steps"
                      + (f" (budget {max_minutes:g} min)" if max_minutes else ""), flush=True)
                if max_minutes:
                    fit = state.global_step + int((max_minutes * 60 - spent) / per)
                    if fit < total and _fit_schedule(kw.get("lr_scheduler"), fit):
                        state.max_steps = self.fitted_steps = fit
                        print(f"gagar sft train: {fit} steps fit the budget; the schedule now ends there",
                              flush=True)
            if self.fitted_steps and state.global_step >= self.fitted_steps:
                control.should_training_stop = True
            if max_minutes and spent > max_minutes * 60:
                self.stopped_at_cap = True
                control.should_training_stop = True

    return Clock()


def _ranking_trainer_class() -> type:
    from trl import SFTTrainer

    class RankingSFTTrainer(SFTTrainer):
        """SFTTrainer whose evaluation also logs the judge's ranking metrics next to the loss."""

        def __init__(
            self,
            *a: Any,
            ranking_records: list[dict[str, Any]] | None = None,
            ranking_max_new_tokens: int = 512,
            **kw: Any,
        ) -> None:
            super().__init__(*a, **kw)
            self.ranking_records = ranking_records or []
            self.ranking_max_new_tokens = ranking_max_new_tokens

        def evaluate(self, *a: Any, **kw: Any) -> dict[str, float]:
            metrics = super().evaluate(*a, **kw)
            if self.ranking_records:
                was_training = self.model.training
                self.model.eval()
                try:
                    m = answer_step_metrics(
                        self.model,
                        self.processing_class,
                        self.ranking_records,
                        max_new_tokens=self.ranking_max_new_tokens,
                    )
                finally:
                    self.model.train(was_training)
                ranked = {f"eval_{k}": float(v) for k, v in m.items() if isinstance(v, int | float)}
                self.log(ranked)
                metrics.update(ranked)
            return metrics

    return RankingSFTTrainer


def _eval_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per evaluation: the loss entry and the ranking entry of the same step merged."""
    rows: dict[int, dict[str, Any]] = {}
    for h in history:
        if any(k.startswith("eval_") for k in h):
            row = rows.setdefault(int(h["step"]), {"step": h["step"], "epoch": h.get("epoch")})
            row.update({k: v for k, v in h.items() if k.startswith("eval_")})
    return [rows[k] for k in sorted(rows)]


def _cpu_seconds() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _export(dest: str, src: Path) -> str:
    """Copy the final model (full weights, or merged) to `dest`, replacing it whole: a reader never sees a mix."""
    import shutil

    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("training_args.bin", "checkpoint-*"))
    old = target.with_name(f".{target.name}.old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return str(target)


def train(cfg: dict[str, Any], *, resume: str | bool | None = None) -> dict[str, Any]:
    """Run one SFT job from a loaded config; returns a summary (also written to OUTPUT/sft_summary.json)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTConfig

    t, lo, ev = cfg["training"], cfg["lora"], cfg["eval"]
    cpu0, load0 = _cpu_seconds(), os.getloadavg()
    out = Path(cfg["output_dir"])
    model_path = _resolve_model(cfg)
    gpu = torch.cuda.is_available()
    bf16 = (gpu and torch.cuda.is_bf16_supported()) if t["bf16"] == "auto" else bool(t["bf16"])
    # Checkpointing trades compute for memory: worth it for a 7B model on one GPU, pure cost on a CPU toy.
    ckpt = gpu if t["gradient_checkpointing"] == "auto" else bool(t["gradient_checkpointing"])
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_rows, dropped_train = _fits(tokenizer, read_records(cfg["data"]["train"]), int(t["max_length"]))
    val_rows, dropped_val = ([], 0)
    if cfg["data"]["val"]:
        val_rows, dropped_val = _fits(tokenizer, read_records(cfg["data"]["val"]), int(t["max_length"]))
    if not train_rows:
        raise ConfigError(
            f"no training record fits max_length={t['max_length']} tokens; raise training.max_length"
        )
    train_ds = Dataset.from_list([{"messages": r["messages"]} for r in train_rows] * max(1, int(t["repeat"])))
    val_ds = Dataset.from_list([{"messages": r["messages"]} for r in val_rows]) if val_rows else None
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if bf16 else torch.float32)
    targets = lo["target_modules"]
    layers = _layer_range(lo["layers"])
    if layers is not None and targets == "all-linear":
        # PEFT takes a layer list only with named modules: every linear layer of the decoder blocks, by name.
        targets = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                          if isinstance(m, torch.nn.Linear) and "lm_head" not in n})
    # LoRA adapts what a pretrained model already knows; a model built from scratch has nothing to adapt, so
    # `lora.enabled: false` trains every weight (the from-scratch judge of `make judge`).
    lora = LoraConfig(
        r=int(lo["r"]),
        lora_alpha=int(lo["alpha"]),
        lora_dropout=float(lo["dropout"]),
        target_modules=targets if isinstance(targets, str) else list(targets),
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    ) if lo["enabled"] else None
    steps_per_epoch = math.ceil(
        len(train_ds) / (int(t["batch_size"]) * int(t["gradient_accumulation_steps"]))
    )
    args = SFTConfig(
        output_dir=str(out),
        num_train_epochs=float(t["epochs"]),
        max_steps=int(t["max_steps"]),
        learning_rate=float(t["learning_rate"]),
        per_device_train_batch_size=int(t["batch_size"]),
        per_device_eval_batch_size=1,
        gradient_accumulation_steps=int(t["gradient_accumulation_steps"]),
        warmup_steps=int(float(t["warmup_ratio"]) * steps_per_epoch * float(t["epochs"])),
        weight_decay=float(t["weight_decay"]),
        lr_scheduler_type=str(t["lr_scheduler"]),
        max_length=int(t["max_length"]),
        packing=bool(t["packing"]),
        train_sampling_strategy=str(t["sampling"]),
        assistant_only_loss=True,
        gradient_checkpointing=ckpt,
        bf16=bf16,
        use_cpu=not gpu,
        logging_steps=int(t["logging_steps"]),
        eval_strategy="epoch" if val_ds is not None else "no",
        save_strategy=str(t["save_strategy"]),
        save_steps=int(t["save_steps"]),
        save_total_limit=int(t["save_total_limit"]) if t["save_total_limit"] else None,
        seed=int(t["seed"]),
        report_to="none",
        dataset_num_proc=None,
    )
    trainer = _ranking_trainer_class()(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=val_ds,
        processing_class=tokenizer,
        peft_config=lora,
        ranking_records=val_rows[: int(ev["max_groups"])] if ev["ranking"] else [],
        ranking_max_new_tokens=int(ev["max_new_tokens"]),
    )
    clock = _clock_callback(float(t["max_minutes"]) if t["max_minutes"] else None)
    trainer.add_callback(clock)
    resume = cfg["resume_from_checkpoint"] if resume is None else resume
    if resume is True:
        resume = get_last_checkpoint(str(out)) if out.is_dir() else None
    elif resume:
        resume = str(resume)
        if not Path(resume).is_dir():
            raise ConfigError(f"resume_from_checkpoint: {resume} is not a checkpoint directory")
    result = trainer.train(resume_from_checkpoint=resume or None)
    adapter_dir = out / ("adapter" if lora else "model")
    trainer.save_model(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    merged_dir = None
    if cfg["merge"] and lora:
        merged_dir = out / "merged"
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(str(merged_dir))
        tokenizer.save_pretrained(str(merged_dir))
    exported = _export(cfg["export_dir"], merged_dir or adapter_dir) if cfg["export_dir"] else None
    history = trainer.state.log_history
    summary = {
        "base_model": model_path,
        "adapter": str(adapter_dir),
        "merged": str(merged_dir) if merged_dir else None,
        "exported": exported,
        "full_weights": lora is None,
        "train_seconds": round(float(result.metrics.get("train_runtime", 0.0)), 1),
        # On a shared machine wall time says little: CPU time of this process and the load around it do.
        "cpu_seconds": round(_cpu_seconds() - cpu0, 1),
        "torch_threads": torch.get_num_threads(),
        "load_average": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]},
        "resumed_from": resume or None,
        "global_step": trainer.state.global_step,
        "stopped_at_time_cap": clock.stopped_at_cap,
        "planned_steps": clock.planned_steps,
        "steps_fitted_to_budget": clock.fitted_steps,
        "train_loss": result.training_loss,
        "records": {"train": len(train_rows), "val": len(val_rows)},
        "dropped_too_long": {"train": dropped_train, "val": dropped_val},
        "device": "cuda" if gpu else "cpu",
        "bf16": bf16,
        "gradient_checkpointing": ckpt,
        "loss_curve": [(h["step"], h["loss"]) for h in history if "loss" in h],
        "eval": _eval_rows(history),
    }
    tmp = out / ".sft_summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / "sft_summary.json")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="gagar sft train", description="LoRA SFT of the judge (TRL + PEFT).")
    p.add_argument(
        "--config", required=True, help="YAML config (see configs/sft_tiny.yaml, configs/sft_gpu.yaml)"
    )
    p.add_argument("--resume", nargs="?", const="last", help="resume from the last checkpoint, or from PATH")
    p.add_argument("--output-dir", help="override `output_dir` of the config")
    p.add_argument("--max-steps", type=int, help="override training.max_steps")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    overrides: dict[str, Any] = {}
    if args.output_dir:
        overrides["output_dir"] = args.output_dir
    if args.max_steps is not None:
        overrides["training"] = {"max_steps": args.max_steps}
    try:
        cfg = load_config(args.config, overrides)
        resume = True if args.resume == "last" else args.resume
        summary = train(cfg, resume=resume)
    except ConfigError as exc:
        print(f"gagar sft train: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"gagar sft train: {exc}", file=sys.stderr)
        return 2
    ev = summary["eval"][-1] if summary["eval"] else {}
    print(
        f"gagar sft train: {summary['global_step']} steps, train loss {summary['train_loss']:.4f}"
        + (
            f", eval loss {ev.get('eval_loss', float('nan')):.4f}, top-1 {ev.get('eval_top1', float('nan')):.2f}, "
            f"parse rate {ev.get('eval_parse_rate', float('nan')):.2f}"
            if ev
            else ""
        )
        + f"; adapter -> {summary['adapter']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
