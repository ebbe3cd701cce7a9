"""Rollout backends. The HTTP server below is a TEST STAND-IN for `vllm serve --enable-lora`: it implements the
two endpoints the openai backend uses (`/v1/completions` with token-id prompts, `/v1/load_lora_adapter`) and
records what it was sent, so the test checks the request shapes and the LoRA hand-over after an update."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from trainer.rollout.openai_server import OpenAIServerBackend, logprobs_look_raw


class _FakeTokenizer:
    eos_token_id = 99

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


class _Handler(BaseHTTPRequestHandler):
    calls: list = []
    no_ids = False  # answer like a server that cannot return sampled token ids

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append((self.path, body))
        if self.path == "/v1/completions":
            text = "ab</tool_call>" if body.get("stop") else "xyz"
            # vLLM's shape with `logprobs` + `return_tokens_as_token_ids`; an eos it sampled is not in the text.
            ids = [ord(c) + 1000 for c in text]
            assert body["return_tokens_as_token_ids"] and body["logprobs"] == 1
            choice = {"text": text, "finish_reason": "stop"}
            if not self.no_ids:
                choice["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-1.0] * len(ids)}
            out = {"choices": [choice]}
        elif self.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            if self.path == "/v1/load_lora_adapter" and not Path(body["lora_path"], "adapter.bin").is_file():
                self.send_response(400)
                self.end_headers()
                return
            out = "ok"
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class _Adapter:
    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        Path(path, "adapter.bin").write_bytes(b"weights")


@pytest.fixture
def server():
    _Handler.calls = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", _Handler.calls
    srv.shutdown()


def test_openai_backend_sends_token_prompts_and_pushes_lora(server, tmp_path):
    url, calls = server
    # the stand-in reports no top log-probs: the raw-log-probs check has nothing to read here (tested below)
    be = OpenAIServerBackend(url, "base-model", _FakeTokenizer(), str(tmp_path), check_logprobs=False)
    [s1, s2] = be.generate([[1, 2, 3], [4]], max_new_tokens=16, temperature=0.7)
    sent = sorted(c[1]["prompt"] for c in calls)
    assert sent == [[1, 2, 3], [4]] and all(c[1]["model"] == "base-model" for c in calls)
    # The sampled ids as the server returned them (not a re-encoding of the text), and nothing else: an eos the
    # server does not list was never shown to be sampled, so it is not trained on (it used to be appended)
    assert s1.token_ids == [ord(c) + 1000 for c in "xyz"] and s1.finish_reason == "stop"
    assert s1.logprobs == [-1.0] * 3  # the sampler's own log-probs come back with the tokens (for TIS)
    [s3] = be.generate([[5]], max_new_tokens=8, temperature=1.0, stop=["</tool_call>"])
    assert s3.text.endswith("</tool_call>") and s3.token_ids[-1] != 99
    be.sync_weights(_Adapter(), step=3)
    path, body = calls[-1]
    assert path == "/v1/load_lora_adapter" and body["lora_name"] == "gagar-step-3"
    assert Path(body["lora_path"]).is_relative_to(tmp_path.resolve())
    be.generate([[6]], max_new_tokens=4, temperature=1.0)
    assert calls[-1][1]["model"] == "gagar-step-3"
    be.sync_weights(_Adapter(), step=4)  # the previous adapter is unloaded after the new one is in
    assert [c[0] for c in calls[-2:]] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]


def test_sampler_logprobs_only_when_complete():
    from trainer.rollout.openai_server import sampled_logprobs

    assert sampled_logprobs({"logprobs": {"token_logprobs": [-0.5, -1]}}, 2) == [-0.5, -1.0]
    assert sampled_logprobs({"logprobs": {"token_logprobs": [None, None]}}, 2) is None  # gagar serve
    assert sampled_logprobs({"logprobs": {"token_logprobs": [-0.5]}}, 2) is None
    assert sampled_logprobs({}, 0) is None


def test_openai_backend_reports_an_unreachable_server(tmp_path):
    be = OpenAIServerBackend("http://127.0.0.1:9", "m", _FakeTokenizer(), str(tmp_path), timeout=2)
    with pytest.raises(RuntimeError, match="cannot reach the rollout server"):
        be.generate([[1]], max_new_tokens=1, temperature=1.0)


def test_vllm_backend_explains_the_missing_extra(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without vLLM: `import vllm` raises
    from trainer.config import TrainConfig
    from trainer.rollout import make_backend

    cfg = TrainConfig()
    cfg.rollout.backend = "vllm"
    cfg.lora.enabled = True
    with pytest.raises(ImportError, match="make venv"):
        make_backend(cfg, None, None, str(tmp_path))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from sft.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-policy")


@pytest.fixture(scope="module")
def tiny_server(tiny_path):
    """`gagar serve` over a tiny random model and its real byte-level BPE tokenizer, on real HTTP; every
    `generate` call of the served model is recorded, so the test knows which tokens were really sampled."""
    from inference.hf import TransformersBackend
    from inference.serve import make_server

    backend = TransformersBackend(str(tiny_path), device="cpu")
    sampled: list[list[int]] = []
    real_generate = backend.model.generate

    def recording_generate(*args, **kwargs):
        out = real_generate(*args, **kwargs)
        sampled.append(out[0, kwargs["input_ids"].shape[1]:].tolist())
        return out

    backend.model.generate = recording_generate
    srv = make_server(backend, port=0, served_name="policy", max_tokens_cap=64)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", backend.tokenizer, sampled
    srv.shutdown()


def test_openai_backend_trains_on_the_token_ids_the_server_sampled(tiny_server, tmp_path):
    url, tokenizer, sampled = tiny_server
    be = OpenAIServerBackend(url, "policy", tokenizer, str(tmp_path))
    prompt = tokenizer("def add(a, b):\n    return", add_special_tokens=False)["input_ids"]
    samples = be.generate([prompt] * 6, max_new_tokens=40, temperature=1.0)
    assert len(sampled) == 6
    eos = tokenizer.eos_token_id
    for s in samples:
        # Exactly a sequence the server's model sampled (up to and including its eos), never a re-encoding.
        truth = next(seq for seq in sampled if seq[: len(s.token_ids)] == s.token_ids)
        assert s.token_ids == (truth[: truth.index(eos) + 1] if eos in truth else truth)
        assert s.text == tokenizer.decode(s.token_ids, skip_special_tokens=True)
    # A random model's samples are mostly not the tokenizer's canonical encoding of their own text: the
    # re-tokenising backend this replaces would have trained on tokens the policy never produced.
    retok = [tokenizer(s.text, add_special_tokens=False)["input_ids"] for s in samples]
    assert any(r != [t for t in s.token_ids if t != eos] for r, s in zip(retok, samples, strict=True))


def test_server_without_token_ids_is_an_error_not_a_silent_retokenisation(server, tmp_path):
    url, _ = server
    be = OpenAIServerBackend(url, "base-model", _FakeTokenizer(), str(tmp_path))
    _Handler.no_ids = True
    try:
        with pytest.raises(RuntimeError, match="no sampled token ids"):
            be.generate([[1]], max_new_tokens=4, temperature=1.0)
    finally:
        _Handler.no_ids = False


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_a_server_reporting_raw_logprobs_is_refused_at_a_temperature(tiny_path, tmp_path, mode):
    """The update's importance correction reads the sampler's log-probs as those of the distribution it sampled
    from; a server in raw mode (vLLM's default) at temperature 0.7 would make every ratio wrong. The backend asks
    the server before its first batch and refuses the mix, naming the flag (gagar serve over real HTTP)."""
    from inference.hf import TransformersBackend
    from inference.serve import make_server

    backend = TransformersBackend(str(tiny_path), device="cpu")
    tokenizer = backend.tokenizer
    srv = make_server(backend, port=0, served_name="policy", max_tokens_cap=64, logprobs_mode=mode)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        be = OpenAIServerBackend(f"http://127.0.0.1:{srv.server_address[1]}", "policy", tokenizer, str(tmp_path))
        prompt = tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
        if mode == "raw":
            with pytest.raises(RuntimeError, match="--logprobs-mode processed_logprobs"):
                be.generate([prompt], max_new_tokens=4, temperature=0.7)
            # at temperature 1 both modes are one distribution; without the correction the mix does not matter
            assert be.generate([prompt], max_new_tokens=4, temperature=1.0)[0].logprobs
            quiet = OpenAIServerBackend(f"http://127.0.0.1:{srv.server_address[1]}", "policy", tokenizer,
                                        str(tmp_path), check_logprobs=False)
            assert quiet.generate([prompt], max_new_tokens=4, temperature=0.7)[0].token_ids
        else:
            [smp] = be.generate([prompt], max_new_tokens=4, temperature=0.7)
            assert smp.logprobs and len(smp.logprobs) == len(smp.token_ids)
    finally:
        srv.shutdown()


def test_the_default_rollout_server_config_checks_the_logprobs_only_with_the_correction(tmp_path):
    from trainer.config import TrainConfig
    from trainer.rollout import make_backend

    cfg = TrainConfig()
    cfg.rollout.backend, cfg.rollout.base_url = "openai", "http://127.0.0.1:9"
    assert make_backend(cfg, None, _FakeTokenizer(), str(tmp_path)).check_logprobs
    cfg.optim.tis_cap = None
    assert not make_backend(cfg, None, _FakeTokenizer(), str(tmp_path)).check_logprobs


@given(logits=st.lists(st.floats(-8, 8), min_size=3, max_size=20, unique=True),
       temperature=st.sampled_from([0.3, 0.6, 0.7, 0.9, 1.3, 2.0]))
def test_raw_and_processed_top_logprobs_are_told_apart(logits, temperature):
    """Only the top-k of a larger vocabulary is seen (normalised over all of it); raw top log-probs asked at T
    equal those at 1, processed ones have their gaps scaled by 1/T. A spread too small for T to move by 0.05 is
    not judged either way."""
    import math

    def top(values, t):
        z = [v / t for v in values] + [0.0] * 50  # the unseen rest of the vocabulary
        lse = math.log(sum(math.exp(x) for x in z))
        return {f"token_id:{i}": z[i] - lse for i in range(len(values))}

    spread = (max(logits) - min(logits)) * abs(1 / temperature - 1)
    assume(abs(spread - 0.05) > 1e-6)
    assert not logprobs_look_raw(top(logits, temperature), top(logits, 1.0), temperature)  # processed
    assert logprobs_look_raw(top(logits, 1.0), top(logits, 1.0), temperature) == (spread > 0.05)  # raw
