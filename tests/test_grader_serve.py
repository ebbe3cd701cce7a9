"""`gagar serve` as a real process on real HTTP, driven by the official `openai` client: every parameter it
honours (n, stop, logprobs/top_logprobs, max_tokens/max_completion_tokens, temperature/top_p, seed, stream),
the ones it refuses (400 naming the parameter), models.list/retrieve, and the judge's `openai` backend.

The model is a tiny RANDOM Qwen2 (`sft.tiny`) with a real byte-level BPE tokenizer and chat template: these
tests check the server's plumbing and its sampling semantics, not what a model says. Its replies are random
text, so each check compares the server with itself (seeded, greedy, streamed vs not) or with a forward pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from test_grader_util import ROOT, bundled_tasks

from grader.grade import grade_groups
from grader.records import load_groups
from inference.base import BackendError
from inference.openai import OpenAIBackend

MSG = [{"role": "user", "content": "Which patch is smaller?"}]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from sft.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-judge")


@pytest.fixture(scope="module")
def server(tiny_model):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gagar.cli", "serve", "--model", str(tiny_model), "--port", "0",
         "--served-model-name", "judge", "--max-tokens-cap", "32", "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    try:
        deadline = time.time() + 180
        url = None
        while time.time() < deadline and url is None:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"gagar serve exited: {proc.stderr.read()}")
            if "serving" in line:
                url = line.strip().split(" on ")[-1]
        assert url and url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=120)


def _pick_stop(text: str) -> str:
    """A two-character piece of `text` first found past its start: a stop string the sample really meets."""
    return next(text[i:i + 2] for i in range(2, len(text) - 2) if text.find(text[i:i + 2]) == i)


def _chat(client, **kw):
    return client.chat.completions.create(model="judge", messages=kw.pop("messages", MSG), **kw)


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list().data] == ["judge"]
    m = client.models.retrieve("judge")
    assert (m.id, m.object, m.owned_by) == ("judge", "model", "gagar") and m.created > 0
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("gpt-4o")
    assert "gpt-4o" in exc.value.message


def test_n_max_tokens_and_max_completion_tokens(client):
    r = _chat(client, n=3, max_tokens=5, seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("length", "stop") for c in r.choices)
    assert r.usage.completion_tokens <= 15 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # max_completion_tokens wins over the older max_tokens, as in OpenAI's API; each choice gets its own budget
    r = _chat(client, max_tokens=20, max_completion_tokens=3, temperature=0, logprobs=True)
    assert len(r.choices[0].logprobs.content) <= 3
    assert r.choices[0].finish_reason == "length" or len(r.choices[0].logprobs.content) < 3
    c = client.completions.create(model="judge", prompt="def add(a, b):", n=2, max_tokens=4, seed=2)
    assert len(c.choices) == 2 and c.usage.completion_tokens <= 8
    # the cap is a clear refusal, not a silent clamp
    with pytest.raises(openai.BadRequestError) as exc:
        _chat(client, max_tokens=33)
    assert exc.value.param == "max_tokens" and "cap" in exc.value.message


def test_temperature_top_p_seed_and_one_default_temperature(client):
    greedy = [c.message.content for c in _chat(client, n=2, temperature=0, max_tokens=8).choices]
    assert greedy[0] == greedy[1]
    # A seed reproduces a sample; the same seed with n=2 still gives two different samples.
    a = [c.message.content for c in _chat(client, n=2, temperature=1.0, max_tokens=8, seed=11).choices]
    b = [c.message.content for c in _chat(client, n=2, temperature=1.0, max_tokens=8, seed=11).choices]
    assert a == b and a[0] != a[1]
    assert [c.message.content for c in _chat(client, n=2, temperature=1.0, max_tokens=8, seed=12).choices] != a
    # No temperature given: 1.0, on both endpoints (OpenAI's and vLLM's default), not greedy.
    assert [c.message.content for c in _chat(client, n=2, max_tokens=8, seed=11).choices] == a
    assert a[0] != greedy[0]
    comp = dict(model="judge", prompt="import os\n", max_tokens=8, n=2)
    c_default = [c.text for c in client.completions.create(seed=5, **comp).choices]
    assert c_default == [c.text for c in client.completions.create(seed=5, temperature=1.0, **comp).choices]
    c_greedy = client.completions.create(temperature=0, **comp).choices[0].text
    assert c_default[0] != c_greedy
    # top_p keeps the smallest set of tokens reaching p: a tiny p keeps only the most likely one → greedy
    assert [c.message.content for c in _chat(client, n=2, top_p=1e-6, max_tokens=8, seed=3).choices] == greedy


def test_stop_strings_cut_the_text_where_they_first_appear(client):
    kw = dict(max_tokens=16, seed=8)
    full = _chat(client, **kw).choices[0].message.content
    stop = _pick_stop(full)
    r = _chat(client, stop=[stop, "never-seen-zz"], **kw)
    assert r.choices[0].message.content == full[: full.find(stop)] and r.choices[0].finish_reason == "stop"
    r = _chat(client, stop=stop, extra_body={"include_stop_str_in_output": True}, **kw)
    assert r.choices[0].message.content == full[: full.find(stop) + len(stop)]
    kw = dict(model="judge", prompt="x = ", max_tokens=16, seed=9)
    text = client.completions.create(**kw).choices[0].text
    stop = _pick_stop(text)
    c2 = client.completions.create(stop=stop, **kw)
    assert c2.choices[0].text == text[: text.find(stop)] and c2.choices[0].finish_reason == "stop"


def test_logprobs_and_top_logprobs(client):
    r = _chat(client, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
        assert t.token == t.top_logprobs[0].token and t.logprob == pytest.approx(t.top_logprobs[0].logprob)  # greedy
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    assert _chat(client, max_tokens=3, logprobs=True, seed=1).choices[0].logprobs.content[0].top_logprobs == []
    assert _chat(client, max_tokens=3).choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as exc:
        _chat(client, max_tokens=3, top_logprobs=2)
    assert exc.value.param == "top_logprobs"
    c = client.completions.create(model="judge", prompt="def f(x):", temperature=0, max_tokens=5, logprobs=2)
    lc = c.choices[0].logprobs
    assert len(lc.tokens) == len(lc.token_logprobs) == len(lc.top_logprobs) == len(lc.text_offset) == 5
    assert all(len(d) == 2 and lc.tokens[i] in d for i, d in enumerate(lc.top_logprobs))
    assert "".join(lc.tokens) == c.choices[0].text and lc.text_offset[0] == 0


def test_streaming_matches_the_non_streamed_reply(client, server):
    kw = dict(n=2, max_tokens=10, seed=21, logprobs=True)
    whole = _chat(client, **kw)
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": True}, **kw))
    text, finish, n_lp = ["", ""], [None, None], [0, 0]
    for ch in chunks[:-1]:
        assert ch.object == "chat.completion.chunk" and ch.usage is None
        for c in ch.choices:
            text[c.index] += c.delta.content or ""
            n_lp[c.index] += len(c.logprobs.content) if c.logprobs else 0
            finish[c.index] = c.finish_reason or finish[c.index]
    assert text == [c.message.content for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]
    assert n_lp == [len(c.logprobs.content) for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert chunks[0].choices[0].delta.role == "assistant"
    # Completions stream too; and a stop string never leaks into the stream (it is held back until it is sure).
    kw = dict(model="judge", prompt="for i in", max_tokens=12, seed=4)
    full = client.completions.create(**kw).choices[0].text
    stop = _pick_stop(full)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=stop, stream=True, **kw)
                       if c.choices)
    assert streamed == full[: full.find(stop)]
    # On the wire: server-sent events, ending with `data: [DONE]` as vllm serve does.
    import httpx2

    with httpx2.stream("POST", f"{server}/chat/completions", timeout=60,
                       json={"model": "judge", "messages": MSG, "max_tokens": 3, "stream": True}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in resp.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][6:])["object"] == "chat.completion.chunk"


def test_batched_prompts_of_different_lengths_match_each_alone(client):
    """A completions request's prompts go through one left-padded batch: each must come out as it does alone
    (same greedy tokens, same log-probabilities), or padding leaked into the attention or the positions."""
    short, long_ = [5, 9, 2], [7, 3, 11, 40, 41, 42, 43, 44, 45, 46, 47, 48]
    kw = dict(model="judge", max_tokens=6, temperature=0, logprobs=2, extra_body={"return_token_ids": True})
    both = client.completions.create(prompt=[short, long_], **kw).choices
    for prompt, got in zip([short, long_], both, strict=True):
        alone = client.completions.create(prompt=prompt, **kw).choices[0]
        assert got.model_extra["token_ids"] == alone.model_extra["token_ids"]
        assert got.logprobs.token_logprobs == pytest.approx(alone.logprobs.token_logprobs, abs=1e-4)


@pytest.mark.parametrize("kw, param", [
    ({"tools": [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
    ({"model": "other"}, "model"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
])
def test_what_it_cannot_honour_is_refused_naming_the_parameter(client, kw, param):
    args = {"model": "judge", "messages": MSG, "max_tokens": 2, **kw}
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as exc:
        client.chat.completions.create(**args)
    assert exc.value.param == param, exc.value.body
    assert exc.value.body["type"] == "invalid_request_error"


def test_no_op_values_of_refused_parameters_are_accepted(client):
    r = _chat(client, max_tokens=2, response_format={"type": "text"}, tools=[], frequency_penalty=0, user="u1")
    assert r.choices[0].message.role == "assistant"


def _post(server: str, path: str, body: dict):
    import httpx2

    return httpx2.post(f"{server}/{path}", json={"model": "judge", **body}, timeout=120)


def test_null_is_the_default_as_in_openai_and_vllm(server):
    """`null` for temperature, top_p, n, stream, logprobs (and the other defaulted fields) means "not given"."""
    base = {"messages": MSG, "max_tokens": 6, "seed": 13}
    want = _post(server, "chat/completions", base)
    nulls = {k: None for k in ("temperature", "top_p", "n", "stream", "logprobs", "top_k", "skip_special_tokens",
                               "stop", "top_logprobs", "stream_options")}
    got = _post(server, "chat/completions", {**base, **nulls})
    assert got.status_code == 200, got.text
    assert [c["message"]["content"] for c in got.json()["choices"]] == \
        [c["message"]["content"] for c in want.json()["choices"]]
    assert got.json()["choices"][0]["logprobs"] is None  # logprobs: null is false
    comp = {"prompt": "def f(x):", "max_tokens": 5, "seed": 3}
    got = _post(server, "completions", {**comp, **{k: None for k in ("temperature", "top_p", "n", "stream",
                                                                     "logprobs", "best_of", "echo")}})
    assert got.status_code == 200, got.text
    assert got.json()["choices"][0]["text"] == _post(server, "completions", comp).json()["choices"][0]["text"]
    assert len(got.json()["choices"]) == 1


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_a_seed_beyond_64_bits_is_a_400_naming_it(server, seed):
    r = _post(server, "chat/completions", {"messages": MSG, "max_tokens": 2, "seed": seed})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    ok = _post(server, "chat/completions", {"messages": MSG, "max_tokens": 2, "seed": 2**63 - 1})
    assert ok.status_code == 200, ok.text


def test_completions_caps_the_number_of_prompts(server):
    from inference.serve_api import MAX_ROWS

    r = _post(server, "completions", {"prompt": [[5, 6]] * (MAX_ROWS + 1), "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and str(MAX_ROWS) in r.text
    r = _post(server, "completions", {"prompt": [[5, 6]] * (MAX_ROWS // 4 + 1), "max_tokens": 1, "n": 4})
    assert r.status_code == 400 and "n=4" in r.json()["error"]["message"]
    r = _post(server, "completions", {"prompt": [[5, 6]] * 3, "max_tokens": 1, "n": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 6


def test_the_eos_text_is_left_out_unless_asked_for(tiny_model):
    """With `skip_special_tokens: false` the eos token's text is still not part of the answer (vLLM), unless
    `include_stop_str_in_output`. The random model is made to emit eos at its third token (a hook on the
    forward pass: plumbing only), so the sample surely ends on eos."""
    import threading

    from inference.hf import TransformersBackend
    from inference.serve import make_server

    backend = TransformersBackend(str(tiny_model), device="cpu")
    eos = min(backend.eos_ids)
    prompt = [11, 12, 13, 14]

    def force_eos(module, args, kwargs, output):
        pos = kwargs.get("position_ids")
        if pos is not None and int(pos.max()) >= len(prompt) + 1:
            output.logits[:, -1, eos] = 1e4
        return output

    backend.model.register_forward_hook(force_eos, with_kwargs=True)
    srv = make_server(backend, port=0, served_name="judge")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    eos_text = backend.tokenizer.decode([eos], skip_special_tokens=False)
    try:
        base = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
        texts = {}
        for skip in (True, False):
            for keep in (False, True):
                r = _post(url, "completions", {**base, "skip_special_tokens": skip, "include_stop_str_in_output": keep})
                c = r.json()["choices"][0]
                assert c["finish_reason"] == "stop" and c["token_ids"][-1] == eos and len(c["token_ids"]) == 3, c
                texts[skip, keep] = c["text"]
                streamed = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in _sse(url, {
                    **base, "skip_special_tokens": skip, "include_stop_str_in_output": keep}))
                assert streamed == c["text"]
        plain = backend.tokenizer.decode(c["token_ids"][:-1], skip_special_tokens=False)
        assert texts[True, False] == texts[True, True] == texts[False, False] == plain
        assert eos_text and eos_text not in plain and texts[False, True] == plain + eos_text
        chat = _post(url, "chat/completions", {"messages": MSG, "max_tokens": 8, "temperature": 0,
                                               "skip_special_tokens": False}).json()
        assert eos_text not in chat["choices"][0]["message"]["content"] and chat["choices"][0]["finish_reason"] == "stop"
    finally:
        srv.shutdown()


def _sse(url: str, body: dict) -> list[str]:
    import httpx2

    with httpx2.stream("POST", f"{url}/completions", json={"model": "judge", **body, "stream": True},
                       timeout=60) as resp:
        return [ln for ln in resp.iter_lines() if ln.startswith("data: {") and '"choices": [{' in ln]


def test_openai_backend_and_judge_over_http(server, tmp_path_factory):
    backend = OpenAIBackend(server.removesuffix("/v1"), "judge")  # /v1 is added when missing
    assert isinstance(backend.chat([{"role": "user", "content": "hello"}], max_new_tokens=4), str)
    tasks = bundled_tasks(tmp_path_factory.getbasetemp())
    groups = load_groups(tasks / "groups.jsonl")[:1]
    [res] = grade_groups(groups, tasks / "repos", judge="llm", backend=backend, max_turns=2, max_new_tokens=16)
    assert res.judge == "llm:judge" and res.fallback  # an untrained random model's reply is not a valid answer
    assert sorted(res.ranking) == sorted(c.rollout_id for c in groups[0].candidates)
    with pytest.raises(BackendError, match="HTTP 404"):
        OpenAIBackend(server, "nope").chat([{"role": "user", "content": "x"}])


def test_openai_backend_reports_an_unreachable_server():
    with pytest.raises(BackendError, match="cannot reach"):
        OpenAIBackend("http://127.0.0.1:9", "judge", timeout=5, max_retries=0).chat([{"role": "user", "content": "x"}])


def test_serve_rejects_a_missing_model(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "gagar.cli", "serve", "--model", str(tmp_path / "none")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2 and "cannot load" in proc.stderr
    # a name that is neither a directory nor a registry model says where the registry's names are
    proc = subprocess.run([sys.executable, "-m", "gagar.cli", "serve", "--model", "smollm2-135m"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and "gagar model ls" in proc.stderr and "smollm2-135m-instruct" in proc.stderr


def test_a_peft_adapter_on_top_of_the_base_is_what_is_served(tiny_model, tmp_path):
    """`--adapter`: the served distribution is base + LoRA (here a random, non-zero LoRA: plumbing only)."""
    import threading

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from inference.hf import TransformersBackend
    from inference.serve import make_server

    torch.manual_seed(0)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model)),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft.save_pretrained(str(tmp_path / "adapter"))
    srv = make_server(TransformersBackend(str(tiny_model), str(tmp_path / "adapter"), device="cpu"), port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.server_address[1]}/v1", api_key="-", max_retries=0)
        # named after what is served (base + adapter), not a fixed `judge`
        assert [m.id for m in client.models.list().data] == [f"{tiny_model.name}+adapter"]
        prompt = [11, 12, 13, 14]
        got = client.completions.create(model=f"{tiny_model.name}+adapter", prompt=prompt, max_tokens=4, temperature=0, logprobs=1,
                                        extra_body={"return_token_ids": True}).choices[0]
    finally:
        srv.shutdown()
    ids = got.model_extra["token_ids"]
    peft.eval()
    with torch.no_grad():
        with_lora = torch.log_softmax(peft(torch.tensor([prompt + ids])).logits[0].float(), -1)
        with peft.disable_adapter():
            base = torch.log_softmax(peft(torch.tensor([prompt + ids])).logits[0].float(), -1)
    want = [float(with_lora[len(prompt) - 1 + k, t]) for k, t in enumerate(ids)]
    assert got.logprobs.token_logprobs == pytest.approx(want, abs=1e-4)
    assert max(abs(float(base[len(prompt) - 1 + k, t]) - w) for k, (t, w) in enumerate(zip(ids, want, strict=True))) > 1e-3


def test_logprobs_mode_processed_reports_the_distribution_sampled_from(tiny_model):
    """`--logprobs-mode processed_logprobs`: a token's log-prob is under the warped distribution (temperature, then
    top-p) it was sampled from — the trainer's `warp_logits` on a forward pass — and not the raw one the default
    mode reports (`test_a_peft_adapter_...` checks the raw one against a forward pass)."""
    import threading

    import torch

    from inference.hf import TransformersBackend
    from inference.serve import make_server
    from trainer.logprobs import warp_logits

    backend = TransformersBackend(str(tiny_model), device="cpu")
    srv = make_server(backend, port=0, served_name="judge", logprobs_mode="processed")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.server_address[1]}/v1", api_key="-", max_retries=0)
        prompt = [11, 12, 13, 14]
        got = client.completions.create(model="judge", prompt=prompt, max_tokens=6, temperature=0.7, top_p=0.9,
                                        seed=3, logprobs=2, extra_body={"return_token_ids": True}).choices[0]
    finally:
        srv.shutdown()
    ids = got.model_extra["token_ids"]
    with torch.no_grad():
        logits = backend.model(torch.tensor([prompt + ids])).logits[0].float()
    at = [len(prompt) - 1 + k for k in range(len(ids))]
    processed = [float(torch.log_softmax(warp_logits(logits, 0.7, 0.9), -1)[i, t]) for i, t in zip(at, ids, strict=True)]
    raw = [float(torch.log_softmax(logits, -1)[i, t]) for i, t in zip(at, ids, strict=True)]
    assert got.logprobs.token_logprobs == pytest.approx(processed, abs=1e-4)
    assert max(abs(p - r) for p, r in zip(processed, raw, strict=True)) > 1e-3


def test_gagar_serve_reports_processed_logprobs_by_default(client, tiny_model):
    """The CLI's default is what the trainer's importance correction needs: the distribution sampled from."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.logprobs import warp_logits

    prompt = [21, 22, 23]
    got = client.completions.create(model="judge", prompt=prompt, max_tokens=4, temperature=0.6, seed=7, logprobs=0,
                                    extra_body={"return_token_ids": True}).choices[0]
    ids = got.model_extra["token_ids"]
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(str(tiny_model))(torch.tensor([prompt + ids])).logits[0].float()
    at = [len(prompt) - 1 + k for k in range(len(ids))]
    processed = [float(torch.log_softmax(warp_logits(logits, 0.6), -1)[i, t]) for i, t in zip(at, ids, strict=True)]
    raw = [float(torch.log_softmax(logits, -1)[i, t]) for i, t in zip(at, ids, strict=True)]
    assert got.logprobs.token_logprobs == pytest.approx(processed, abs=1e-4)
    assert max(abs(p - r) for p, r in zip(processed, raw, strict=True)) > 1e-3


def test_serve_refuses_an_unknown_logprobs_mode():
    proc = subprocess.run([sys.executable, "-m", "gagar.cli", "serve", "--model", "m", "--logprobs-mode", "final"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2 and "--logprobs-mode" in proc.stderr and "processed_logprobs" in proc.stderr
