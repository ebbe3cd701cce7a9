"""Warm start: a short supervised pass that teaches a fresh (e.g. random tiny) policy to answer the single-turn
prompt with the bundled tasks' rollout patches — passing ones of different quality and failing ones — so that
its samples mix passing and failing patches and RL has mixed-outcome groups to learn from (the SFT → RL order
real runs use). A masked cross-entropy on the answer tokens; the prompts are built by the same code the
rollouts use, so the warm-started model sees exactly the RL prompt format. A random model trains every weight; a
pretrained one (`warmstart.lora: true`) trains a LoRA adapter (the `lora` section's shape), which keeps what it
knows, costs a third less compute (no weight gradients for the base) and is merged into the saved weights, so RL
puts its own fresh adapter on top of the warm-started model and the KL reference is that model.

The result is cached under `model.cache_dir/warmstart-<hash>` keyed by everything that shapes it, written whole
or not at all (`sandbox.report.staged_dir`).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from sandbox.jsonl import JsonlError, read_jsonl
from sandbox.records import Instance
from sandbox.report import staged_dir
from trainer.agent.edits import as_answer
from trainer.agent.prompts import single_turn_prompt
from trainer.agent.tokens import Conversation
from trainer.config import RolloutConfig, TasksConfig, TrainConfig
from trainer.logprobs import token_logprobs
from trainer.tasks import fixed_subset, load_instances, other_split_ids

_MARKER = "gagar_warmstart.json"


def _read_jsonl(path: Path) -> list[dict]:
    try:
        return read_jsonl(path)
    except JsonlError as exc:
        raise ValueError(f"warmstart: {exc}") from exc


def clean_patch(patch: str) -> str:
    """Drop `index <sha>..<sha>` lines: `git apply` does not need them and they are pure noise to imitate."""
    return "".join(ln for ln in patch.splitlines(keepends=True) if not ln.startswith("index "))


def warmstart_tasks(cfg: TrainConfig, instances: dict[str, Instance]) -> tuple[dict[str, Instance], Path]:
    """The tasks the warm start imitates rollouts of, and their repositories: `warmstart.tasks_dir`'s own
    tasks when set, else the training tasks."""
    if not cfg.warmstart.tasks_dir:
        return instances, cfg.tasks.repos_path()

    # The training split applies there too (when that set has splits), and no task of another split of the
    # training set may be imitated: a held-out task's fix must never be shown to the policy.
    split = cfg.tasks.split if (Path(cfg.warmstart.tasks_dir) / "splits.json").is_file() else ""
    tasks = TasksConfig(dir=cfg.warmstart.tasks_dir, split=split)
    try:
        found = load_instances(tasks)
    except (OSError, ValueError) as exc:
        raise ValueError(f"warmstart.tasks_dir: {exc}") from exc
    if held := sorted(set(found) & other_split_ids(cfg.tasks)):
        raise ValueError(f"warmstart.tasks_dir {cfg.warmstart.tasks_dir} holds {len(held)} task(s) of a split the "
                         f"run does not train on (e.g. {held[0]}); a warm start must never imitate them")
    return found, tasks.repos_path()


def warmstart_examples(cfg: TrainConfig, instances: dict[str, Instance]) -> list[tuple[str, str, str]]:
    """(instance_id, kind, patch) for every bundled rollout of a wanted kind on one of `instances`; a task set
    without rollouts (no predictions file, e.g. `gagar tasks synth`'s) gives its reference fixes as `gold`.
    `warmstart.max_examples` keeps a fixed subset (the same for every seed)."""
    w = cfg.warmstart
    tdir = Path(w.tasks_dir or cfg.tasks.instances_path().parent)
    pred_path = Path(w.predictions or tdir / "predictions.jsonl")
    if not pred_path.is_file() and not w.predictions and "gold" in w.kinds:
        out = [(iid, "gold", clean_patch(inst.patch)) for iid, inst in sorted(instances.items()) if inst.patch]
        return fixed_subset(out, w.max_examples)
    return fixed_subset(_rollout_examples(cfg, instances, tdir, pred_path), w.max_examples)


def _rollout_examples(cfg: TrainConfig, instances: dict[str, Instance], tdir: Path,
                      pred_path: Path) -> list[tuple[str, str, str]]:
    preds = _read_jsonl(pred_path)
    kinds = {(e["instance_id"], str(e["rollout_id"])): e["kind"]
             for e in _read_jsonl(Path(cfg.warmstart.expected or tdir / "expected.jsonl"))}
    out = []
    for p in preds:
        iid, rid = p["instance_id"], str(p.get("rollout_id"))
        kind = kinds.get((iid, rid))
        if iid in instances and kind in cfg.warmstart.kinds and p.get("model_patch"):
            out.append((iid, kind, clean_patch(p["model_patch"])))
    if not out:
        raise ValueError(f"warmstart: no rollouts of kinds {cfg.warmstart.kinds} for the training instances")
    return out


def answers_in_format(examples: list[tuple[str, str, str]], instances: dict[str, Instance], repos: Path,
                      r: RolloutConfig) -> list[tuple[str, str, str]]:
    """(instance_id, kind, answer): each imitated patch written as the answer of `rollout.edit_format` (the
    patch itself for `diff`; the code shown, rewritten, for `function`; SEARCH/REPLACE blocks). A patch that
    does not touch the code the prompt shows cannot be written in a region format and is left out."""
    if r.edit_format == "diff":
        return examples
    out = []
    for iid, kind, patch in examples:
        region = single_turn_prompt(instances[iid], repos, r.max_context_chars, r.edit_format,
                                    r.max_region_lines).region
        answer = as_answer(r.edit_format, region, patch) if region else None
        if answer is not None:
            out.append((iid, kind, answer))
    if not out:
        raise ValueError(f"warmstart: none of the {len(examples)} patches can be written as a "
                         f"{r.edit_format} answer (each must change only the code its prompt shows)")
    return out


def warmup_steps(total: int) -> int:
    """The learning-rate warm-up of a warm start of `total` optimizer steps: 10 steps, but never more than a
    tenth of the run (a 12-step warm start would otherwise spend almost all of it below its learning rate)."""
    return max(1, min(10, total // 10))


def ensure_warmstart(cfg: TrainConfig, base_path: str, instances: dict[str, Instance], tokenizer: Any,
                     log=print) -> str:
    if cfg.warmstart.source == "mutations":
        from trainer.mutation_sft import ensure_mutation_warmstart

        return ensure_mutation_warmstart(cfg, base_path, log=log)
    instances, repos = warmstart_tasks(cfg, instances)
    w, r = cfg.warmstart, cfg.rollout
    examples = answers_in_format(warmstart_examples(cfg, instances), instances, repos, r)
    prompts: dict[str, list[int]] = {}
    for iid, _kind, _patch in examples:
        if iid not in prompts:
            prompts[iid] = Conversation(tokenizer, single_turn_prompt(
                instances[iid], repos, r.max_context_chars, r.edit_format, r.max_region_lines).messages).ids
    # The prompts themselves are in the key: a change to what the prompt shows must not reuse an old warm start.
    shape = {"epochs": w.epochs, "lr": w.lr, "batch": w.batch_size, "seed": cfg.seed, "ctx": r.max_context_chars,
             "examples": examples, "commits": sorted(i.base_commit for i in instances.values()),
             "prompts": hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()}
    if w.lora:  # only then does the adapter's shape matter (older full-weight caches keep their keys)
        shape["lora"] = {"r": cfg.lora.r, "alpha": cfg.lora.alpha, "targets": list(cfg.lora.target_modules)}
    warmup = warmup_steps(w.epochs * ((len(examples) + w.batch_size - 1) // w.batch_size))
    if warmup != 10:  # a short warm start warms up for a tenth of its steps (longer ones keep their keys)
        shape["warmup"] = warmup
    key = hashlib.sha256(json.dumps({
        "base": str(Path(base_path).resolve()) if Path(base_path).exists() else base_path, **shape,
    }, sort_keys=True).encode()).hexdigest()[:16]
    from inference.models import models_root

    target = models_root(cfg.model.cache_dir) / f"warmstart-{key}"
    if (target / _MARKER).is_file():
        log(f"warm start: reusing {target}")
        return str(target)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if w.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=0.0,
                                                 target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM"))
    model.train()
    t0, trained_tokens = time.monotonic(), 0
    data = []
    for iid, _kind, patch in examples:
        answer = tokenizer(patch, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        data.append((prompts[iid], answer))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=w.lr, weight_decay=0.0)
    total = w.epochs * ((len(data) + w.batch_size - 1) // w.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.05, 1 - s / total))
    rng = random.Random(cfg.seed)
    pad = tokenizer.pad_token_id
    loss_val = float("nan")
    for epoch in range(w.epochs):
        rng.shuffle(data)
        losses = []
        for i in range(0, len(data), w.batch_size):
            batch = data[i : i + w.batch_size]
            seqs = [p + a for p, a in batch]
            width = max(map(len, seqs))
            ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.float32)
            attn = torch.zeros((len(seqs), width), dtype=torch.long)
            for k, (p, a) in enumerate(batch):
                ids[k, : len(p) + len(a)] = torch.tensor(p + a)
                mask[k, len(p) : len(p) + len(a)] = 1
                attn[k, : len(p) + len(a)] = 1
            logp, _ = token_logprobs(model, ids, attn, mask)
            loss = -logp.sum() / mask[:, 1:].sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            trained_tokens += int(attn.sum())
        loss_val = sum(losses) / len(losses)
        if epoch == 0 or (epoch + 1) % 10 == 0 or epoch + 1 == w.epochs or w.epochs <= 10:
            log(f"warm start: epoch {epoch + 1}/{w.epochs} loss {loss_val:.3f} ({time.monotonic() - t0:.0f} s)")
    if w.lora:
        model = model.merge_and_unload()  # a plain model again: RL adds its own adapter on top
    with staged_dir(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({
            "examples": len(data), "final_loss": loss_val, "lora": w.lora, "seconds": round(time.monotonic() - t0, 1),
            "tokens_per_s": round(trained_tokens / max(1e-9, time.monotonic() - t0), 1)}) + "\n")
    return str(target)
