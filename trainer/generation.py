"""Rollouts: n trajectories per task from the rollout backend, and the behaviour policy's log-probs of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sandbox.config import SandboxConfig
from sandbox.records import Instance
from trainer.agent import Trajectory, run_agent_episodes, run_single_turn
from trainer.config import RolloutConfig
from trainer.policy import pad_batch, token_logprobs


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
