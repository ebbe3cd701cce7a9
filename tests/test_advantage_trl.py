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
                        quality_fn=quality)  # defaults: grpo + gagar (paper form, cap 3), as the native trainer
    trainer.seen = []
    trainer.train()

    assert len(trainer.seen) == 2 and len(rewards_seen) == 16
    r = torch.tensor(rewards_seen).view(-1, N_GEN)
    expect = redistribute(compute_advantages(r, estimator="grpo"), r >= 3, torch.where(r >= 5, 1.0, 0.2))
    used = torch.cat(trainer.seen)
    # TRL may shuffle rows inside a generation batch: compare per generation batch as sorted values
    for step in range(2):
        got = torch.sort(trainer.seen[step].flatten())[0]
        want = torch.sort(expect[step * 2 : step * 2 + 2].flatten())[0]
        assert torch.allclose(got, want, atol=1e-5), (got, want)
    grpo = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    assert not torch.allclose(torch.sort(used)[0], torch.sort(grpo.flatten())[0], atol=1e-3)  # not TRL's own
    assert torch.allclose(trainer.last_advantages, expect[2:].flatten(), atol=1e-5)


class _TwoProcesses:
    """Stands in for accelerate with 2 processes: this one is ``rank``; the other's objects are given."""

    def __init__(self, rank: int, other: dict) -> None:
        self.process_index, self.is_main_process, self.other = rank, rank == 0, other


def _bare_trainer(rank: int, other: dict, quality_fn):
    t = object.__new__(GagarGRPOTrainer)
    t.accelerator = _TwoProcesses(rank, other)
    t.reward_weights = torch.ones(1)
    t.model = torch.nn.Linear(1, 1).train()
    t.num_generations = 4
    t.advantage_estimator, t.advantage_params = "grpo", {}
    t.quality_fn, t.gagar_cap, t.gagar_form, t.failure_reward = quality_fn, 3.0, "paper", 0.0

    def gather(items):  # gather_object: every process's list, in rank order
        mine, theirs = list(items), t.accelerator.other[id(items)] if id(items) in t.accelerator.other else None
        return [*mine, *theirs] if rank == 0 else [*theirs, *mine]

    t._gather_objects = gather
    t._broadcast = lambda obj: obj if rank == 0 else t.accelerator.other["broadcast"]
    return t


def test_quality_fn_judges_whole_groups_gathered_across_processes():
    # One group of 4 completions spans two processes (2 each): the judge must see all four, not a slice.
    seen = []

    def quality(inputs, completions, rewards):
        seen.append(list(completions))
        passed = rewards > 0
        weights = torch.tensor([1.0 if c.startswith("clean") else 0.2 for c in completions])
        return {"passed": passed, "weights": torch.where(passed, weights, math.nan),
                "hacked": torch.tensor([c == "hack" for c in completions])}

    rewards = torch.tensor([[1.0], [1.0], [1.0], [0.0]])  # gathered: clean, bloated (process 0) | hack, wrong (1)
    local = {0: (["p"] * 2, ["clean", "bloated"]), 1: (["p"] * 2, ["hack", "wrong"])}
    t0 = _bare_trainer(0, {}, quality)
    cap0 = {"inputs": local[0][0], "completions": local[0][1], "rewards_per_func": rewards}
    t0.accelerator.other = {id(cap0["inputs"]): local[1][0], id(cap0["completions"]): local[1][1]}
    adv0 = t0._our_advantages(cap0)
    assert seen == [["clean", "bloated", "hack", "wrong"]]  # the whole group, once, on the main process
    base = compute_advantages(torch.tensor([[1.0, 1.0, 0.0, 0.0]]), estimator="grpo")[0]  # the hack fails
    want = redistribute(base[None], torch.tensor([[True, True, False, False]]),
                        torch.tensor([[1.0, 0.2, math.nan, math.nan]]))[0]
    assert torch.allclose(adv0, want) and adv0[0] > adv0[1] > 0 > adv0[2]
    # process 1 does not judge: it receives the main process's verdicts and computes the same advantages
    q = t0._quality(cap0, rewards.sum(1))
    t1 = _bare_trainer(1, {}, quality)
    cap1 = {"inputs": local[1][0], "completions": local[1][1], "rewards_per_func": rewards}
    t1.accelerator.other = {id(cap1["inputs"]): local[0][0], id(cap1["completions"]): local[0][1], "broadcast": q}
    seen.clear()
    assert torch.allclose(t1._our_advantages(cap1), adv0) and seen == []


def test_defaults_are_grpo_plus_gagar():
    import inspect

    sig = inspect.signature(GagarGRPOTrainer.__init__).parameters
    assert sig["advantage_estimator"].default == "grpo" and sig["gagar_form"].default == "paper"
