"""`TransformersBackend.sample`, the one sampling path of the policy, the judge and `gagar serve`: raw log-probs
that match a forward pass, stop strings, seeds, streaming callbacks and cancellation, and a distribution set by
the request alone (never by the model's own generation_config).

The model is a tiny RANDOM Qwen2 (`sft.tiny`): these are plumbing checks, compared with the model's own forward
pass or with the backend itself, never with what a trained model would say."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.base import SamplingParams


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from inference.hf import TransformersBackend
    from sft.tiny import build_tiny_model

    return TransformersBackend(str(build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-sampling")), device="cpu")


def _prompt(backend, text: str = "def add(a, b):\n    return") -> list[int]:
    return backend.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_logprobs_are_the_models_raw_distribution(backend):
    prompt = _prompt(backend)
    (s,) = backend.sample([prompt], SamplingParams(8, temperature=0.7, top_p=0.9, logprobs=4, seed=3))
    seq = torch.tensor([prompt + s.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(backend.model(seq).logits[0].float(), -1)
    for k, tid in enumerate(s.token_ids):
        row = logp[len(prompt) - 1 + k]
        assert s.logprobs[k] == pytest.approx(float(row[tid]), abs=1e-4)
        top = row.topk(4)
        assert [t for t, _ in s.top_logprobs[k]] == top.indices.tolist()
        assert [v for _, v in s.top_logprobs[k]] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_the_request_alone_decides_the_distribution(backend):
    """A hub model's generation_config (top-k, repetition penalty, ...) must not change what a request asks
    for: the trainer scores its importance ratio under temperature and top-p only."""
    prompt = _prompt(backend)
    params = SamplingParams(6, temperature=1.0, seed=5)
    before = [s.token_ids for s in backend.sample([prompt] * 4, params)]
    cfg = backend.model.generation_config
    saved = (cfg.top_k, cfg.repetition_penalty)
    cfg.top_k, cfg.repetition_penalty = 1, 10.0
    try:
        after = [s.token_ids for s in backend.sample([prompt] * 4, params)]
    finally:
        cfg.top_k, cfg.repetition_penalty = saved
    assert after == before and len({tuple(t) for t in before}) > 1  # top_k=1 would have made them all one


def test_stop_strings_seed_streaming_and_cancel(backend):
    prompt = _prompt(backend, "class A:")
    for seed in range(100):  # a seed whose sample runs to the length limit (a random model may emit eos early)
        params = SamplingParams(16, temperature=1.0, seed=seed)
        (free,) = backend.sample([prompt], params)
        if free.finish_reason == "length":
            break
    stop = next(free.text[i:i + 2] for i in range(2, len(free.text) - 2) if free.text.find(free.text[i:i + 2]) == i)
    (cut,) = backend.sample([prompt], SamplingParams(16, temperature=1.0, seed=seed, stop=[stop]))
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < len(free.token_ids)
    assert stop in cut.text and stop not in backend.tokenizer.decode(cut.token_ids[:-1])
    # Streaming sees every token, in order, and ends with the same sample.
    seen: list[int] = []
    (streamed,) = backend.sample([prompt], params, on_token=lambda i, row: seen.append(row.token_ids[-1])
                                 if row.finish is None or len(seen) < len(row.token_ids) else None)
    assert streamed.token_ids == free.token_ids == seen
    cancel = threading.Event()

    def stop_after_three(i, row):
        if len(row.token_ids) >= 3:
            cancel.set()

    (short,) = backend.sample([prompt], params, on_token=stop_after_three, cancel=cancel)
    assert short.finish_reason == "abort" and len(short.token_ids) == 3


def test_processed_logprobs_are_what_the_trainer_scores(backend):
    """logprobs_mode="processed" (gagar serve --logprobs-mode processed_logprobs, as vLLM's): the log-prob under
    the distribution sampled from — the trainer's own warper (`trainer.logprobs.warp_logits`) on a forward pass."""
    from trainer.logprobs import warp_logits

    prompt = _prompt(backend)
    (s,) = backend.sample([prompt], SamplingParams(8, temperature=0.7, top_p=0.9, logprobs=0, seed=4,
                                                   logprobs_mode="processed"))
    with torch.no_grad():
        logits = backend.model(torch.tensor([prompt + s.token_ids])).logits[0].float()
    want = torch.log_softmax(warp_logits(logits, 0.7, 0.9), -1)
    for k, tid in enumerate(s.token_ids):
        assert s.logprobs[k] == pytest.approx(float(want[len(prompt) - 1 + k, tid]), abs=1e-4)


def test_a_row_ends_where_its_sampling_ended_when_pad_is_eos(backend):
    """Qwen-style tokenizers pad with an eos id: a row that stopped on a stop string while the other rows ran on
    is padded with eos, and none of that padding may read as a sampled token (nor change the other rows)."""
    saved = backend.pad_id
    backend.pad_id = min(backend.eos_ids)
    try:
        prompts = [_prompt(backend, "x = 1"), _prompt(backend, "import os, sys")]
        for seed in range(100):
            free = backend.sample(prompts, SamplingParams(16, temperature=1.0, seed=seed))
            if all(s.finish_reason == "length" for s in free):
                break
        text = free[0].text
        stop = next(text[i:i + 2] for i in range(2, len(text) - 2) if text.find(text[i:i + 2]) == i)
        cut = backend.sample(prompts, SamplingParams(16, temperature=1.0, seed=seed, stop=[stop]))
    finally:
        backend.pad_id = saved
    assert cut[0].finish_reason == "stop" and cut[0].token_ids == free[0].token_ids[: len(cut[0].token_ids)]
    assert not set(cut[0].token_ids) & backend.eos_ids and len(cut[0].token_ids) < 16
    assert cut[1].token_ids == free[1].token_ids  # the other row sampled on, untouched
