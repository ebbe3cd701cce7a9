"""The update's standard options on a real tiny Qwen2 (LoRA off: full weights, so gradients are easy to compare):
gradient accumulation, the loss aggregations (Dr. GRPO's constant included), truncated importance sampling
against the sampler's log-probs, the LR schedule; and the loop's overlong filtering, dropped agent episodes,
rloo/dr_grpo as the base estimator, and the vLLM backend built on the warm-started base (a stand-in
`vllm` module checks that plumbing fast, and says so)."""

from __future__ import annotations

import copy
import math
import sys
import types

import pytest
import torch

from trainer.agent import Trajectory
from trainer.agent.tokens import Conversation
from trainer.config import OptimConfig, TrainConfig, _build
from trainer.update import _aggregate, lr_factor, policy_update


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from sft.tiny import build_tiny_model

    torch.manual_seed(0)
    path = build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-update")
    return AutoModelForCausalLM.from_pretrained(str(path))


def _items(model) -> list[tuple[Trajectory, float]]:
    """Four rollouts of different lengths with their behaviour log-probs scored by `model` itself (ratio 1)."""
    from trainer.generation import record_behaviour_logprobs

    g = torch.Generator().manual_seed(1)
    trajs = []
    for k, n in enumerate((5, 9, 3, 7)):
        ids = torch.randint(5, 500, (4 + n,), generator=g).tolist()
        trajs.append(Trajectory("i", f"r{k}", ids, [0] * 4 + [1] * n, 4, ""))
    record_behaviour_logprobs(model, 0, trajs, temperature=1.0, top_p=1.0, batch_size=4)
    return list(zip(trajs, [1.0, -0.5, 2.0, -1.0], strict=True))


def _step(model, items, **optim) -> torch.nn.Module:
    m = copy.deepcopy(model)
    o = OptimConfig(lr=0.1, max_grad_norm=1e9, **optim)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=o.lr)
    policy_update(m, opt, [(copy.deepcopy(t), a) for t, a in items], o, pad_id=0, temperature=1.0, top_p=1.0,
                  seed=0, loss_scale=16)
    return m


def _same(a, b, tol=1e-6) -> bool:
    return all(torch.allclose(x, y, atol=tol) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                                 "seq_mean_token_sum_norm"])
def test_gradient_accumulation_is_the_same_update_as_one_batch(model, agg):
    items = _items(model)
    whole = _step(model, items, minibatch_size=4, grad_accum=1, loss_agg=agg)
    accumulated = _step(model, items, minibatch_size=1, grad_accum=4, loss_agg=agg)
    assert _same(whole, accumulated, tol=1e-5)
    assert not _same(whole, model)  # the update moved something


def test_loss_aggregations_by_hand():
    tok = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])

    def agg(name):
        return float(_aggregate(tok, mask, OptimConfig(loss_agg=name), n_tokens=4, n_seqs=2, loss_scale=10))

    assert agg("token_mean") == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert agg("seq_mean_token_mean") == pytest.approx((2 + 4) / 2)
    assert agg("seq_mean_token_sum") == pytest.approx((6 + 4) / 2)
    assert agg("seq_mean_token_sum_norm") == pytest.approx((6 + 4) / (2 * 10))  # Dr. GRPO: a constant
    # the former name and verl's spelling are accepted; a typo names the key
    assert _build({"optim": {"loss_agg": "seq_mean"}}).optim.loss_agg == "seq_mean_token_mean"
    assert _build({"optim": {"loss_agg": "seq-mean-token-sum-norm"}}).optim.loss_agg == "seq_mean_token_sum_norm"
    with pytest.raises(ValueError, match="optim.loss_agg"):
        _build({"optim": {"loss_agg": "token-sum"}})
    cfg = _build({"rollout": {"mode": "agent", "max_new_tokens": 100, "max_turns": 3}})
    assert cfg.policy_token_budget() == 300


def test_truncated_importance_sampling_reweights_by_the_sampler_gap(model):
    items = _items(model)
    plain = _step(model, items)
    # the sampler gave every token log(4) less than the trainer: weight min(4, cap)
    gap = [(copy.deepcopy(t), a) for t, a in items]
    for t, _ in gap:
        t.sampler_logprobs = [x - math.log(4) for x in t.old_logprobs]
    capped = _step(model, gap, tis_cap=2.0)
    doubled = _step(model, [(t, 2 * a) for t, a in items])  # ratio 1 at the first step: the same gradient
    assert _same(capped, doubled, tol=1e-5) and not _same(capped, plain)
    assert _same(_step(model, gap, tis_cap=None), plain)  # TIS off: the sampler's log-probs are ignored
    same = [(copy.deepcopy(t), a) for t, a in items]
    for t, _ in same:
        t.sampler_logprobs = list(t.old_logprobs)  # sampler == trainer: weight 1
    assert _same(_step(model, same), plain, tol=1e-6)
    o = OptimConfig(lr=0.0, tis_cap=2.0)
    stats = policy_update(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), gap, o, pad_id=0,
                          temperature=1.0, top_p=1.0, seed=0)
    assert stats["tis_mean"] == pytest.approx(2.0) and stats["tis_capped"] == 1.0


def test_conversation_keeps_the_sampler_logprobs_aligned_with_its_tokens():
    class Tok:
        eos_token_id, eos_token = 0, "<eos>"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return "".join(f"[{m['role']}]{m['content']}" for m in messages) + ("[assistant]" if add_generation_prompt
                                                                                  else "")

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

    conv = Conversation(Tok(), [{"role": "user", "content": "hi"}])
    n0 = len(conv)
    conv.add_policy([101, 102], "ab", [-0.1, -0.2])
    conv.add_env({"role": "tool", "content": "x"})
    conv.add_policy([103], "c", [-0.3])
    lp = conv.sampler_logprobs()
    assert len(lp) == len(conv) - 1
    assert lp[n0 - 1 : n0 + 1] == [-0.1, -0.2] and lp[-1] == -0.3  # entry t is token t+1's
    assert conv.ids[n0] == 101 and conv.ids[-1] == 103
    conv.add_policy([104], "d")  # a turn without them: the whole conversation has none (no partial TIS)
    assert conv.sampler_logprobs() is None


def test_lr_schedule_warmup_then_constant_or_cosine():
    const = OptimConfig(warmup_steps=2)
    assert [lr_factor(s, const, 10) for s in (1, 2, 3, 10)] == pytest.approx([0.5, 1.0, 1.0, 1.0])
    cos = OptimConfig(lr_schedule="cosine", warmup_steps=0, min_lr_ratio=0.1)
    f = [lr_factor(s, cos, 10) for s in range(1, 11)]
    assert f[-1] == pytest.approx(0.1) and all(a > b for a, b in zip(f, f[1:], strict=False))
    assert lr_factor(5, cos, 10) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(ValueError, match="warmup_steps"):
        _build({"steps": 3, "optim": {"lr_schedule": "cosine", "warmup_steps": 3}})



def test_a_short_warm_start_reaches_its_learning_rate_early():
    """The warm start warmed up over a fixed 10 steps: `make demo`'s 18-step warm start spent half its steps
    below its learning rate. A tenth of the run now, at most 10 steps (long warm starts keep their schedule)."""
    from trainer.warmstart import warmup_steps

    assert [warmup_steps(n) for n in (1, 12, 18, 35, 100, 1000)] == [1, 1, 1, 3, 10, 10]


# ── the loop's side: overlong filtering, dropped episodes, base estimators ────────────────────────────────────
def _loop_trainer(*overrides: str):
    from trainer.loop import Trainer

    t = object.__new__(Trainer)
    t.cfg = _build({})
    for o in overrides:
        section, kv = o.split(".", 1)
        key, value = kv.split("=")
        setattr(getattr(t.cfg, section), key, type(getattr(getattr(t.cfg, section), key))(value)
                if not isinstance(getattr(getattr(t.cfg, section), key), bool) else value == "true")
    t.policy = types.SimpleNamespace(model=None, optimizer=None, pad_id=0, ref_model=None)
    return t


def _group(finishes: list[str], passed: list[bool]):
    from sandbox.records import EvalResult, Instance
    from trainer.groups import RolloutGroup

    inst = Instance.from_dict({"instance_id": "i", "repo": "o/r", "base_commit": "c", "patch": "", "test_patch": "",
                               "FAIL_TO_PASS": [], "PASS_TO_PASS": [], "problem_statement": ""})
    trajs = [Trajectory("i", f"r{k}", [1, 2], [0, 1], 1, "", finish=f) for k, f in enumerate(finishes)]
    res = [EvalResult("i", "m", t.rollout_id, "resolved" if p else "unresolved", resolved=p)
           for t, p in zip(trajs, passed, strict=True)]
    return RolloutGroup(inst, trajs, res)


def test_overlong_filtering_leaves_truncated_rollouts_out_of_the_loss_only(monkeypatch):
    from trainer import rewards

    seen = {}
    monkeypatch.setattr("trainer.loop.policy_update", lambda m, o, items, *a, **k: seen.update(items=items, **k) or {})
    g = _group(["stop", "length", "stop", "stop"], [True, False, False, True])
    for flag, left_out in (("false", []), ("true", ["r1"])):
        t = _loop_trainer(f"optim.overlong_filter={flag}", "advantage.mode=grpo")
        adv = rewards.base_advantages([g], t.cfg.advantage)
        assert adv[0, 1] < 0  # still in the baseline: its verdict is real
        stats = t.update([g], adv, step=1)
        assert [tr.rollout_id for tr, _ in seen["items"]] == [r for r in g.rollout_ids if r not in left_out]
        assert stats["overlong_filtered"] == len(left_out)
    assert seen["loss_scale"] == t.cfg.policy_token_budget() and seen["lr"] == t.cfg.optim.lr


def test_dropped_agent_episodes_leave_the_group(monkeypatch):
    from trainer import loop, rewards

    g = _group(["submitted", "max_turns", "submitted", "context"], [True, True, False, False])
    monkeypatch.setattr(loop, "generate", lambda *a, **k: [g.trajs])
    monkeypatch.setattr(loop, "record_behaviour_logprobs", lambda *a, **k: None)
    t = _loop_trainer("rollout.mode=agent", "rollout.drop_unfinished=true", "advantage.mode=grpo")
    t.backend, t.instances, t.repos = None, {}, None
    t.pool = types.SimpleNamespace(config=lambda: None)
    t.policy = types.SimpleNamespace(model=None, pad_id=0, tokenizer=None)
    t.sample(["i"], "s1")
    assert [tr.dropped for tr in g.trajs] == [False, True, False, True] and g.valid == [True, False, True, False]
    adv = rewards.base_advantages([g], t.cfg.advantage)
    alone = rewards.compute_advantages(torch.tensor([[1.0, 0.0]]), estimator="grpo", eps=1e-6)[0]
    assert adv[0, [0, 2]].tolist() == pytest.approx(alone.tolist()) and adv[0, [1, 3]].tolist() == [0.0, 0.0]
    from trainer.metrics import step_row

    row = step_row(1, [g], [g], {})
    assert row["dropped"] == 2 and row["pass_rate"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="rollout.drop_unfinished"):
        _build({"rollout": {"drop_unfinished": True}})


@pytest.mark.parametrize("base", ["rloo", "dr_grpo"])
def test_rloo_and_dr_grpo_are_selectable_base_estimators(base):
    from trainer import rewards

    cfg = _build({"advantage": {"mode": f"{base}+gagar"}})
    assert cfg.advantage.estimator == base and cfg.advantage.redistribution == "gagar"
    g = _group(["stop"] * 4, [True, False, True, True])
    adv = rewards.base_advantages([g], cfg.advantage)
    want = rewards.compute_advantages(torch.tensor([[1.0, 0.0, 1.0, 1.0]]), estimator=base)
    assert torch.allclose(adv, want)


# ── vLLM: the engine loads the base the adapter belongs to ───────────────────────────────────────────────────
@pytest.fixture
def fake_vllm(monkeypatch):
    """A STAND-IN for the `vllm` package (no engine start, for speed; tests/test_vllm_engine.py runs the real
    one): records how the engine is built and answers generate with fixed tokens and log-probs, to check the
    plumbing only."""
    built = {}

    class LLM:
        def __init__(self, model, **kw):
            built.update(model=model, **kw)

        def generate(self, prompts, params, lora_request=None, use_tqdm=False):
            built["params"] = params
            lp = types.SimpleNamespace
            return [lp(outputs=[lp(token_ids=[7, 8], text="ab", finish_reason="stop", stop_reason=None,
                                   logprobs=[{7: lp(logprob=-0.25)}, {8: lp(logprob=-1.5)}])] * p["n"])
                    for p in params]

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, lambda **kw: kw
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    for name, mod in {"vllm": vllm, "vllm.inputs": inputs}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    yield built
    from inference.vllm import shutdown_all

    shutdown_all()


def test_vllm_engine_takes_the_warm_started_base_and_returns_sampler_logprobs(fake_vllm, tmp_path):
    from trainer.rollout import make_backend

    (tmp_path / "warmstart-abc").mkdir()
    (tmp_path / "warmstart-abc" / "config.json").write_text("{}")
    cfg = TrainConfig()
    cfg.rollout.backend = "vllm"
    be = make_backend(cfg, None, None, str(tmp_path), base_path=str(tmp_path / "warmstart-abc"))
    assert fake_vllm["model"] == str(tmp_path / "warmstart-abc")  # not cfg.model.name_or_path ("tiny")
    assert fake_vllm["logprobs_mode"] == "processed_logprobs" and fake_vllm["enable_lora"]
    assert fake_vllm["seed"] == cfg.seed and fake_vllm["generation_config"] == "vllm"
    s1, s2, s3 = be.generate([[1, 2], [1, 2], [3]], max_new_tokens=4, temperature=0.7, top_p=0.9)
    assert s1.token_ids == [7, 8] and s1.logprobs == [-0.25, -1.5]
    # repeats of a prompt are one request for n samples (one prefill); no per-request seed (it kills the CPU
    # engine with n > 1: the seed is the engine's)
    assert [p["n"] for p in fake_vllm["params"]] == [2, 1]
    assert all(p["logprobs"] == 0 and "seed" not in p for p in fake_vllm["params"])
    be.close()


def test_trainer_hands_back_the_engine_when_it_dies_and_keeps_the_last_checkpoint(monkeypatch, tmp_path):
    """An engine that dies mid-run: the run stops with the engine's error (naming the cause), hands its backend
    back (a `vllm serve` it started is stopped) and writes no checkpoint for the step it could not finish, so
    `--resume` starts that step again."""
    from inference.vllm import EngineError
    from trainer import loop

    closed = []
    backend = types.SimpleNamespace(close=lambda: closed.append("backend"))
    monkeypatch.setattr(loop, "load_instances", lambda cfg: {"a": None, "b": None})
    monkeypatch.setattr(loop, "build_policy", lambda *a, **k: types.SimpleNamespace(
        model=None, tokenizer=None, base_path="/b", optimizer=None, pad_id=0))
    monkeypatch.setattr("trainer.rollout.make_backend", lambda *a, **k: backend)
    monkeypatch.setattr(loop, "SandboxPool", lambda *a, **k: types.SimpleNamespace(config=lambda: None))

    def dies(*a, **k):
        raise EngineError("the vLLM engine on /b died during generate (killed)")

    monkeypatch.setattr(loop, "generate", dies)
    cfg = _build({"out": str(tmp_path / "run"), "tensorboard": False, "steps": 2})
    trainer = loop.Trainer(cfg, log=lambda m: None)
    with pytest.raises(EngineError, match="died during generate"):
        trainer.run()
    assert closed == ["backend"] and not (tmp_path / "run" / "checkpoints").exists()


def test_sampling_mismatch_counts_policy_tokens_only():
    from trainer.generation import mismatch_means, sampling_mismatch

    t = Trajectory("i", "r", [1, 2, 3, 4, 5], [0, 0, 1, 1, 1], 2, "")
    t.old_logprobs = [-2.0, -1.0, -0.5, -0.7]  # entry k scores token k+1: entries 1-3 are the policy's
    t.sampler_logprobs = [0.0, -1.0, -0.5, -0.2]  # entry 0 (a prompt token) differs but does not count
    hf = Trajectory("i", "r2", [1, 2], [0, 1], 1, "")  # transformers backend: no sampler log-probs
    hf.old_logprobs = [-3.0]
    sums = sampling_mismatch([t, hf], clip_low=0.2, clip_high=0.28)
    assert sums["sampler_tokens"] == 3
    got = mismatch_means(sums)
    assert got["sampler_logprob_diff"] == pytest.approx(0.5 / 3)
    assert got["sampler_ratio_outside_clip"] == pytest.approx(1 / 3)  # exp(-0.5) = 0.61 < 0.8
    assert sampling_mismatch([hf], clip_low=0.2, clip_high=0.28) == {} and mismatch_means({}) == {}


def test_trainer_hands_the_policy_base_to_the_backend(monkeypatch, tmp_path):
    from trainer import loop

    got = {}
    monkeypatch.setattr(loop, "load_instances", lambda cfg: {})
    monkeypatch.setattr(loop, "build_policy", lambda *a, **k: types.SimpleNamespace(
        model=None, tokenizer=None, base_path="/runs/x/warmstart-1", optimizer=None))
    monkeypatch.setattr("trainer.rollout.make_backend", lambda *a, **k: got.update(k) or object())
    monkeypatch.setattr(loop, "SandboxPool", lambda *a, **k: types.SimpleNamespace(config=lambda: None))
    cfg = _build({"out": str(tmp_path / "run"), "tensorboard": False})
    loop.Trainer(cfg, log=lambda m: None)
    assert got["base_path"] == "/runs/x/warmstart-1"
