"""Rollouts: n trajectories per task from the rollout backend, the behaviour policy's log-probs of them, and how
far the sampling engine's own log-probs of the same tokens are from the trainer's (sampling vs scoring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sandbox.config import SandboxConfig
from sandbox.records import Instance
from trainer.agent import Trajectory, run_agent_episodes, run_single_turn
from trainer.config import RolloutConfig
from trainer.logprobs import pad_batch, token_logprobs


def generate(r: RolloutConfig, backend: Any, tokenizer: Any, instances: dict[str, Instance], ids: list[str],
             tag: str, *, repos_dir: Path, sandbox: SandboxConfig) -> list[list[Trajectory]]:
    """`r.n` trajectories for each task id (rollout ids `{tag}-{task}-{k}`), grouped per task."""
    jobs = [(instances[i], f"{tag}-{g}-{k}") for g, i in enumerate(ids) for k in range(r.n)]
    if r.mode == "single_turn":
        trajs = run_single_turn(jobs, backend, tokenizer, repos_dir=repos_dir,
                                max_context_chars=r.max_context_chars, max_new_tokens=r.max_new_tokens,
                                temperature=r.temperature, top_p=r.top_p, max_prompt_tokens=r.max_prompt_tokens,
                                edit_format=r.edit_format, max_region_lines=r.max_region_lines)
    else:
        trajs = run_agent_episodes(jobs, backend, tokenizer, repos_dir=repos_dir, sandbox=sandbox,
                                   max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
                                   temperature=r.temperature, top_p=r.top_p, tool_timeout=r.tool_timeout_s,
                                   tool_output_chars=r.tool_output_chars,
                                   max_total_tokens=r.max_prompt_tokens + r.max_turns * r.max_new_tokens)
    return [trajs[g * r.n : (g + 1) * r.n] for g in range(len(ids))]


@torch.no_grad()
def record_behaviour_logprobs(model: Any, pad_id: int, trajs: list[Trajectory], *, temperature: float,
                              top_p: float, batch_size: int) -> None:
    """log π_behaviour of every policy token (the importance ratio's denominator), scored by the trainer's model
    at generation time under the distribution the tokens were sampled from (temperature, top-p), so both sides
    of the ratio use the same numerics and the same policy."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for i in range(0, len(trajs), max(1, batch_size)):
            chunk = trajs[i : i + batch_size]
            ids, attn, lmask = pad_batch([t.token_ids for t in chunk], [t.mask for t in chunk], pad_id, device)
            logp, _ = token_logprobs(model, ids, attn, lmask, temperature=temperature, top_p=top_p)
            for t, row in zip(chunk, logp.cpu(), strict=True):
                t.old_logprobs = row[: len(t.token_ids) - 1].tolist()
    finally:
        model.train(was)


def sampling_mismatch(trajs: list[Trajectory], *, clip_low: float, clip_high: float) -> dict[str, float]:
    """Sampling vs scoring, over every policy token whose engine reported its log-prob (vLLM, a server; the
    transformers backend samples from the trainer's model and reports none): the sum of |log π_sampler − log
    π_trainer| and the number of tokens whose ratio π_trainer / π_sampler lies outside [1 − clip_low,
    1 + clip_high] — sums, so the batches of a step add up (`mismatch_means` turns them into the step's figures).
    π_trainer is `old_logprobs` (the trainer's float32 scoring, the importance ratio's denominator)."""
    diffs: list[float] = []
    for t in trajs:
        if t.sampler_logprobs is None or t.old_logprobs is None:
            continue
        diffs += [a - b for m, a, b in zip(t.mask[1:], t.old_logprobs, t.sampler_logprobs, strict=False) if m]
    if not diffs:
        return {}
    d = torch.tensor(diffs, dtype=torch.float64)
    ratio = d.exp()
    outside = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
    return {"sampler_tokens": float(len(diffs)), "sampler_absdiff_sum": float(d.abs().sum()),
            "sampler_outside_clip_n": float(outside.sum())}


def mismatch_means(sums: dict[str, float]) -> dict[str, float]:
    """The step's sampling-vs-scoring figures from `sampling_mismatch`'s sums: `sampler_logprob_diff` (mean
    |Δ log-prob| per token), `sampler_ratio_outside_clip` (share of tokens) and `sampler_tokens`."""
    n = sums.get("sampler_tokens", 0.0)
    if not n:
        return {}
    return {"sampler_tokens": int(n), "sampler_logprob_diff": sums["sampler_absdiff_sum"] / n,
            "sampler_ratio_outside_clip": sums["sampler_outside_clip_n"] / n}
