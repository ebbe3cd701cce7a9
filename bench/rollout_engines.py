#!/usr/bin/env python3
"""Rollout engines compared (not a timed test): the same model, prompts, n, max_tokens and temperature through HF
`generate` (the trainer's transformers backend), vLLM in-process (`rollout.backend: vllm`) and a `vllm serve` the
trainer starts (`vllm-server`) — tokens/s — and then one RL step of the demo's config on each, with its wall time
split: generate / score (the trainer's behaviour log-probs) / update / sandbox / grade (check + rank) / sync.

    .venv/bin/python bench/rollout_engines.py [--config configs/demo.yaml] [--tasks 4] [--n 4] [--max-tokens 128]
        [--temperature 0.7] [--engines hf,vllm,vllm-server] [--no-step] [--out bench/results/rollout_engines.json]

The prompts are the RL prompts of the config's first tasks (`rollout.max_context_chars` of source), each asked
for n samples. Engine start-up is timed apart from sampling. The RL step runs `gagar train` for one step with
`rollout.backend` switched (the warm start is the config's, cached after the first engine). Goal: vLLM >= 10x HF
`generate` in tokens/s. Run it under the machine's heavy-job lock to report it (`flock /work/heavy.lock ...`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ENGINES = ("hf", "vllm", "vllm-server")
STEP_KEYS = ("gen_s", "score_s", "update_s", "eval_s", "check_s", "rank_s", "sync_s", "step_s")


def _prompts(cfg, n_tasks: int) -> tuple[list[list[int]], list[str], object]:
    from trainer.agent.prompts import single_turn_messages
    from trainer.agent.tokens import Conversation
    from trainer.policy import base_model_path, load_tokenizer
    from trainer.tasks import load_instances

    base = base_model_path(cfg.model)
    tok = load_tokenizer(base)
    instances = load_instances(cfg)
    ids = sorted(instances)[:n_tasks]
    repos = cfg.tasks.repos_path()
    prompts = [Conversation(tok, single_turn_messages(instances[i], repos, cfg.rollout.max_context_chars)).ids
               for i in ids]
    return prompts, ids, tok


def _backend(engine: str, cfg, tok, work: Path):
    """(backend, seconds to start it): the engine on the base model, as the trainer builds it."""
    from trainer.policy import base_model_path

    base = base_model_path(cfg.model)
    t0 = time.monotonic()
    if engine == "hf":
        import torch
        from transformers import AutoModelForCausalLM

        from inference.hf import TransformersBackend

        model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, cfg.model.dtype)).eval()
        be = TransformersBackend(model, tokenizer=tok, batch_size=64)
    else:
        from inference.vllm import VLLMBackend, policy_spec

        spec = policy_spec(base, lora_rank=cfg.lora.r, dtype=cfg.model.dtype, seed=cfg.seed,
                           kv_cache_gib=cfg.rollout.kv_cache_gib)
        if engine == "vllm":
            be = VLLMBackend(base, tokenizer=tok, work_dir=str(work), spec=spec)
        else:
            from inference.vllm_server import VLLMServer
            from trainer.rollout.openai_server import OpenAIServerBackend

            server = VLLMServer(spec, work).start()
            be = OpenAIServerBackend(server.url, server.model, tok, str(work), server=server)
    return be, time.monotonic() - t0


def _close(be) -> None:
    from inference.backends import close_backend
    from inference.vllm import shutdown_all

    close_backend(be)
    shutdown_all()


def sample(engine: str, cfg, prompts: list[list[int]], tok, args, work: Path) -> dict:
    be, start_s = _backend(engine, cfg, tok, work)
    try:
        batch = [p for p in prompts for _ in range(args.n)]
        be.generate(batch[:1], max_new_tokens=4, temperature=args.temperature)  # warm-up, not timed
        t0 = time.monotonic()
        samples = be.generate(batch, max_new_tokens=args.max_tokens, temperature=args.temperature)
        wall = time.monotonic() - t0
    finally:
        _close(be)
    tokens = sum(len(s.token_ids) for s in samples)
    return {"start_s": round(start_s, 1), "sample_s": round(wall, 1), "tokens": tokens,
            "sequences": len(samples), "tokens_per_s": round(tokens / wall, 2),
            "stopped": sum(s.finish_reason == "stop" for s in samples)}


def rl_step(engine: str, args, work: Path) -> dict:
    """One step of `gagar train` with `rollout.backend` switched; its metrics row."""
    from trainer.config import load_config
    from trainer.loop import train

    backend = {"hf": "transformers"}.get(engine, engine)
    out = work / f"step-{engine}"
    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(args.config, [f"rollout.backend={backend}", "steps=1", f"out={json.dumps(str(out))}",
                                    "tensorboard=false", *args.set])
    t0 = time.monotonic()
    summary = train(cfg, log=lambda m: None)
    row = summary["last"]
    got = {k: row.get(k) for k in STEP_KEYS}
    got.update(run_s=round(time.monotonic() - t0, 1), rollouts=row.get("rollouts"),
               rollout_tokens=row.get("rollout_tokens"), pass_rate=row.get("pass_rate"),
               groups_kept=row.get("groups_kept"), sampler_logprob_diff=row.get("sampler_logprob_diff"),
               sampler_ratio_outside_clip=row.get("sampler_ratio_outside_clip"))
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--set", action="append", default=[], help="config override section.key=value (repeatable)")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--no-step", action="store_true", help="tokens/s only, no RL step")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "rollout_engines.json"))
    args = p.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        p.error(f"unknown engine(s) {bad}; choose from {', '.join(ENGINES)}")

    from sandbox.jsonl import atomic_write_text
    from trainer.config import load_config

    cfg = load_config(args.config, args.set)
    prompts, ids, tok = _prompts(cfg, args.tasks)
    result: dict = {
        "settings": {"config": os.path.relpath(args.config, ROOT), "model": cfg.model.name_or_path,
                     "dtype": cfg.model.dtype, "tasks": ids, "prompt_tokens": [len(x) for x in prompts],
                     "n": args.n, "max_tokens": args.max_tokens, "temperature": args.temperature,
                     "overrides": args.set},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_start": os.getloadavg()},
        "sampling": {}, "rl_step": {},
    }
    with tempfile.TemporaryDirectory(prefix="gagar-engines-") as tmp:
        for e in engines:
            print(f"== sampling: {e}", flush=True)
            result["sampling"][e] = sample(e, cfg, prompts, tok, args, Path(tmp) / e)
            print(json.dumps(result["sampling"][e]), flush=True)
        if not args.no_step:
            for e in engines:
                print(f"== one RL step: {e}", flush=True)
                result["rl_step"][e] = rl_step(e, args, Path(tmp))
                print(json.dumps(result["rl_step"][e]), flush=True)
    s = result["sampling"]
    if "hf" in s:
        result["speedup_vs_hf"] = {e: round(s[e]["tokens_per_s"] / s["hf"]["tokens_per_s"], 2) for e in s if e != "hf"}
    result["machine"]["load_avg_end"] = os.getloadavg()
    atomic_write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("sampling", "speedup_vs_hf") if k in result}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # vLLM starts its engine processes with spawn: this guard is required
    sys.exit(main())
