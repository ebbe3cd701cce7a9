"""The mutation warm start (`warmstart.source: mutations`): LoRA SFT (TRL `SFTTrainer` + PEFT, through
`sft.train`) of the policy's base on mutation pairs of the training split's projects (`trainer.mutation_data`),
merged into the base so that RL puts its own adapter on top and the KL reference is the warm-started model.

Cached under `model.cache_dir/warmstart-mut-<key>`, keyed by a hash of everything that shapes it — the records
(so the prompts and answers, hence the edit format and the projects' code), the training settings and the base
model — and shared by every run seed (`warmstart.seed` seeds it, not the run's `seed`): the arms and seeds of an
experiment start from the same weights. Training checkpoints go to `<key>.work/`, so a cut run resumes; the
cache directory is written whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from sandbox.jsonl import write_jsonl_atomic
from sandbox.report import staged_dir
from trainer.config import TrainConfig

MARKER = "gagar_warmstart.json"


def base_identity(base_path: str) -> str:
    """What the base weights are: a pulled model's recorded sha256, else its path."""
    meta = Path(base_path) / "gagar_model.json"
    try:
        return json.loads(meta.read_text())["sha256"]
    except (OSError, ValueError, KeyError):
        return str(Path(base_path).resolve()) if Path(base_path).exists() else base_path


def mutation_records(cfg: TrainConfig) -> list[dict[str, Any]]:
    """The warm start's pairs for this config: its training split's projects (every task of the split, whatever
    `tasks.instance_ids` or the frontier keep: the pairs do not depend on them), its edit format and limits."""
    from trainer.mutation_data import mutation_pairs, training_projects
    from trainer.tasks import load_instances

    if not cfg.tasks.split:
        raise ValueError("warmstart.source=mutations needs tasks.split (the training split): pairs are made only "
                         "from that split's projects, so that no held-out project's code is trained on")
    r, w = cfg.rollout, cfg.warmstart
    instances = load_instances(cfg.tasks.model_copy(update={"instance_ids": [], "languages": []}))
    projects = training_projects(cfg.tasks.instances_path(), cfg.tasks.repos_path(), cfg.tasks.split, instances)
    settings = {"count": w.mutations, "seed": w.seed, "edit_format": r.edit_format,
                "max_region_lines": r.max_region_lines, "max_chars": r.max_context_chars,
                "per_function": w.per_function}
    # Making the pairs parses every function of every project (minutes); every run of an experiment asks for
    # them, so they are kept by what makes them: the projects' code (by commit), the settings, and the code
    # that turns a mutation into a pair.
    code = [Path(__file__).resolve().parents[1] / m for m in _PAIR_CODE]
    key = hashlib.sha256(json.dumps({"projects": [(p.repo, p.commit, sorted(p.task_keys)) for p in projects],
                                     "settings": settings, "code": [f.read_text() for f in code]},
                                    sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cfg.model.cache_dir) / f"mutation-pairs-{key}.jsonl"
    if path.is_file():
        from sandbox.jsonl import read_jsonl

        return read_jsonl(path)
    records = mutation_pairs(projects, **settings)
    write_jsonl_atomic(path, records)
    return records


_PAIR_CODE = ("synth/mutate.py", "synth/order.py", "synth/statement.py", "trainer/mutation_data.py",
              "trainer/agent/edits.py", "trainer/agent/prompts.py", "trainer/agent/format.py")


def sft_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The `sft.train` config's lora and training sections for the warm start."""
    w, lo = cfg.warmstart, cfg.lora
    return {
        "lora": {"r": lo.r, "alpha": lo.alpha, "dropout": 0.0, "target_modules": list(lo.target_modules),
                 "layers": w.layers or None},
        # `warmstart.batch_size` examples per optimiser step, one sequence at a time (no padding, and the
        # full-vocabulary logits of one sequence only: TRL's loss over a padded CPU batch took 15 GB here)
        "training": {"epochs": w.epochs, "learning_rate": w.lr, "batch_size": 1,
                     "gradient_accumulation_steps": w.batch_size, "max_length": cfg.rollout.max_prompt_tokens
                     + cfg.rollout.max_new_tokens, "warmup_ratio": 0.03, "lr_scheduler": "cosine",
                     "bf16": w.bf16, "seed": w.seed, "logging_steps": 10,
                     "save_strategy": "steps", "save_steps": 20, "save_total_limit": 1,
                     "max_minutes": w.max_minutes},
    }


def warmstart_key(cfg: TrainConfig, base_path: str, records: list[dict[str, Any]]) -> str:
    """What is trained on (the records' messages: where a pair came from does not matter), how, and on what."""
    data = hashlib.sha256(json.dumps([r["messages"] for r in records], sort_keys=True).encode()).hexdigest()
    return hashlib.sha256(json.dumps({"base": base_identity(base_path), "data": data, "sft": sft_settings(cfg)},
                                     sort_keys=True).encode()).hexdigest()[:16]


def ensure_mutation_warmstart(cfg: TrainConfig, base_path: str,
                              log: Any = print) -> str:
    """The warm-started base model's directory (trained now, or reused from the cache)."""
    t0 = time.monotonic()
    records = mutation_records(cfg)
    if not records:
        raise ValueError("warmstart: the mutation engine made no pair from the training projects")
    key = warmstart_key(cfg, base_path, records)
    target = Path(cfg.model.cache_dir) / f"warmstart-mut-{key}"
    if (target / MARKER).is_file():
        log(f"warm start: reusing {target}")
        return str(target)
    work = target.with_name(target.name + ".work")
    log(f"warm start: {len(records)} mutation pairs of {len({r['repo'] for r in records})} training projects "
        f"({time.monotonic() - t0:.0f} s to make); LoRA SFT into {target} (resumable in {work})")
    work.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(work / "pairs.jsonl", [{"messages": r["messages"]} for r in records])
    write_jsonl_atomic(work / "pairs_meta.jsonl", [{k: v for k, v in r.items() if k != "messages"} for r in records])
    from gagar.schema import validate
    from sft.train import SftConfig, train

    sft = {"model": base_path, "tiny_model": None, "data": {"train": str(work / "pairs.jsonl"), "val": None},
           "output_dir": str(work / "sft"), **sft_settings(cfg), "eval": {"ranking": False, "max_groups": 1,
                                                                         "max_new_tokens": 1},
           "merge": True, "export_dir": None, "resume_from_checkpoint": True}
    summary = train(validate(SftConfig, sft).model_dump())
    with staged_dir(target) as tmp:
        shutil.copytree(summary["merged"], tmp, dirs_exist_ok=True)
        shutil.copy2(work / "pairs_meta.jsonl", tmp / "pairs_meta.jsonl")
        (tmp / MARKER).write_text(json.dumps({
            "source": "mutations", "pairs": len(records), "edit_format": cfg.rollout.edit_format,
            "projects": sorted({r["repo"] for r in records}), "final_loss": summary["train_loss"],
            "steps": summary["global_step"], "planned_steps": summary["planned_steps"],
            "stopped_at_time_cap": summary["stopped_at_time_cap"],
            "steps_fitted_to_budget": summary["steps_fitted_to_budget"], "seconds": summary["train_seconds"],
            "cpu_seconds": summary["cpu_seconds"], "load_average": summary["load_average"],
            "loss_curve": summary["loss_curve"]}, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    log(f"warm start: loss {summary['train_loss']:.3f} after {summary['global_step']} steps "
        f"({summary['train_seconds']:.0f} s)")
    return str(target)
