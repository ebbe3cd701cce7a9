"""GagarGRPOTrainer: real TRL 1.16 GRPO steps on CPU with a tiny random Qwen2 (sft.tiny) and a toy reward."""

import math

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from sft.tiny import build_tiny_model
from trainer.advantage import compute_advantages, redistribute
from trainer.integrations.trl_grpo import GagarGRPOTrainer

N_GEN = 4


class Recording(GagarGRPOTrainer):
    """Records the advantages the loss actually receives (stand-in for nothing: TRL's own loss runs)."""

    seen: list

    def _compute_loss(self, model, inputs):
        self.seen.append(inputs["advantages"].detach().clone())
        return super()._compute_loss(model, inputs)


def toy_reward(completions, **_):
    # Deterministic, spread over 0..6 so groups have ties, spreads and (sometimes) constant values.
    return [float(sum(map(ord, c)) % 7) for c in completions]


@pytest.mark.slow
def test_two_grpo_steps_use_our_gagar_advantages(tmp_path):
    path = build_tiny_model(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    rewards_seen: list[float] = []

    def reward(completions, **kw):
        out = toy_reward(completions)
        rewards_seen.extend(out)
        return out

    def quality(inputs, completions, rewards):
        passed = rewards >= 3
        weights = torch.where(rewards >= 5, 1.0, 0.2)  # stand-in grader: higher reward = better tier
        return {"passed": passed, "weights": torch.where(passed, weights, math.nan)}

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=8, num_generations=N_GEN,
        max_completion_length=8, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to="none",
        save_strategy="no", seed=0, temperature=1.0,
    )
    data = Dataset.from_dict({"prompt": ["def add(a, b):", "Fix the bug in", "diff --git a/x", "{\"k\": 1}"] * 4})
    trainer = Recording(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                        advantage_estimator="gapo", quality_fn=quality, gagar_cap=3.0)
    trainer.seen = []
    trainer.train()

    assert len(trainer.seen) == 2 and len(rewards_seen) == 16
    r = torch.tensor(rewards_seen).view(-1, N_GEN)
    expect = redistribute(compute_advantages(r), r >= 3, torch.where(r >= 5, 1.0, 0.2))
    used = torch.cat(trainer.seen)
    # TRL may shuffle rows inside a generation batch: compare per generation batch as sorted values
    for step in range(2):
        got = torch.sort(trainer.seen[step].flatten())[0]
        want = torch.sort(expect[step * 2 : step * 2 + 2].flatten())[0]
        assert torch.allclose(got, want, atol=1e-5), (got, want)
    grpo = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    assert not torch.allclose(torch.sort(used)[0], torch.sort(grpo.flatten())[0], atol=1e-3)  # not TRL's own
    assert torch.allclose(trainer.last_advantages, expect[2:].flatten(), atol=1e-5)
