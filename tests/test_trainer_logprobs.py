"""The importance ratio compares the right policies: behaviour log-probs are scored under the distribution the
rollouts were sampled from (temperature, top-p), and so are the new ones — on a real tiny Qwen2 model."""

from __future__ import annotations

import pytest
import torch

from trainer.agent import Trajectory
from trainer.generation import record_behaviour_logprobs
from trainer.logprobs import token_logprobs, warp_logits


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from sft.tiny import build_tiny_model

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(str(build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-lp")))


def _traj() -> Trajectory:
    ids = [5, 17, 300, 42, 9, 1000, 77, 3]
    return Trajectory("i", "r", ids, [0, 0, 0, 1, 1, 1, 1, 1], 3, "")


def _reference(model, traj: Trajectory, temperature: float, top_p: float) -> list[float]:
    """log π(token) by hand: softmax(logits / T), nucleus kept (HF's TopPLogitsWarper rule), renormalised."""
    with torch.no_grad():
        logits = model(torch.tensor([traj.token_ids])).logits[0, :-1].double() / temperature
    out = []
    for t, nxt in enumerate(traj.token_ids[1:]):
        if not traj.mask[t + 1]:
            out.append(0.0)
            continue
        p = logits[t].softmax(-1)
        order = p.argsort(descending=True)
        before = p[order].cumsum(0) - p[order]
        keep = order[before < top_p]
        q = torch.zeros_like(p)
        q[keep] = p[keep] / p[keep].sum()
        out.append(float(q[nxt].log()) if q[nxt] > 0 else -30.0)
    return out


@pytest.mark.parametrize("temperature, top_p", [(0.5, 1.0), (0.7, 0.9), (1.0, 1.0)])
def test_behaviour_logprobs_use_the_sampling_distribution(model, temperature, top_p):
    traj = _traj()
    record_behaviour_logprobs(model, 0, [traj], temperature=temperature, top_p=top_p, batch_size=4)
    assert traj.old_logprobs == pytest.approx(_reference(model, traj, temperature, top_p), abs=1e-4)
    if temperature != 1.0:  # and they differ from the T = 1 scores the loop used to record
        plain = _reference(model, traj, 1.0, 1.0)
        assert max(abs(a - b) for a, b in zip(traj.old_logprobs, plain, strict=True)) > 0.05


def test_ratio_is_one_before_the_first_update(model):
    """Same weights, same distribution: exp(new − old) = 1 on every policy token (at T = 0.5, top-p 0.9)."""
    traj = _traj()
    record_behaviour_logprobs(model, 0, [traj], temperature=0.5, top_p=0.9, batch_size=4)
    ids = torch.tensor([traj.token_ids])
    mask = torch.tensor([traj.mask], dtype=torch.float32)
    new, _ = token_logprobs(model, ids, torch.ones_like(ids), mask, temperature=0.5, top_p=0.9)
    sel = mask[0, 1:].bool()
    ratio = torch.exp(new[0][sel] - torch.tensor(traj.old_logprobs)[sel])
    assert ratio.tolist() == pytest.approx([1.0] * int(sel.sum()), abs=1e-5)


def test_top_p_keeps_the_nucleus_and_at_least_one_token():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = warp_logits(logits, 1.0, 0.75).softmax(-1)[0]
    assert kept.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=1e-6)
    assert warp_logits(logits, 1.0, 0.1).softmax(-1)[0, 0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="temperature > 0"):
        warp_logits(logits, 0.0, 1.0)


def _backend(model, tmp_path_factory):
    from transformers import AutoTokenizer

    from inference.hf import TransformersBackend

    tok = AutoTokenizer.from_pretrained(str(tmp_path_factory.getbasetemp() / "tiny-lp"))
    return TransformersBackend(model, tokenizer=tok)


def test_transformers_sampler_draws_from_the_distribution_the_trainer_scores(model, tmp_path_factory, monkeypatch):
    """A checkpoint whose generation_config carries decoding defaults (repetition_penalty, no_repeat_ngram_size,
    min_new_tokens, top_k, suppress_tokens — Qwen's ship several): the policy's sampler must not apply them, since
    the trainer's warper (temperature, then top-p) does not. Checked on the processors `generate` really built and
    by sampling."""
    from transformers import GenerationMixin

    backend = _backend(model, tmp_path_factory)
    prompt = [5, 17, 300, 42, 9]
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1]
    favourite = int(first.argmax())
    defaults = model.generation_config
    defaults.update(repetition_penalty=3.0, no_repeat_ngram_size=1, min_new_tokens=3, top_k=5,
                    suppress_tokens=[favourite])
    built = []
    real = GenerationMixin._get_logits_processor

    def record(self, *a, **k):
        built.append(real(self, *a, **k))
        return built[-1]

    monkeypatch.setattr(GenerationMixin, "_get_logits_processor", record)
    samples = backend.generate([prompt] * 16, max_new_tokens=2, temperature=0.7, top_p=0.9)
    assert model.generation_config is defaults and defaults.repetition_penalty == 3.0  # the checkpoint's, restored
    names = sorted(type(p).__name__ for p in built[-1] if type(p).__name__ != "_Record")  # _Record: log-probs only
    assert names == ["TemperatureLogitsWarper", "TopPLogitsWarper"], names
    x = torch.randn(4, first.shape[-1]) * 3
    ids = torch.tensor([prompt] * 4)
    assert torch.allclose(built[-1](ids, x.clone()).softmax(-1), warp_logits(x, 0.7, 0.9).softmax(-1), atol=1e-6)
    # by sampling: at T = 0.05 the trainer's distribution puts ~all mass on `favourite`; suppress_tokens (and the
    # repetition penalty on the prompt's tokens) would make it impossible
    p_fav = float(warp_logits(first[None], 0.05, 1.0).softmax(-1)[0, favourite])
    sharp = backend.generate([prompt] * 16, max_new_tokens=1, temperature=0.05, top_p=1.0)
    assert p_fav > 0.9 and sum(s.token_ids[:1] == [favourite] for s in sharp) >= 10
    assert len(samples) == 16
