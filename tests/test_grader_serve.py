"""`gagar serve` (real HTTP on 127.0.0.1, tiny random model) and the `openai` backend talking to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_grader_util import ROOT, bundled_tasks

from grader.backends import BackendError, OpenAIBackend
from grader.grade import grade_groups
from grader.records import load_groups


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from sft.tiny import build_tiny_model

    model = build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-judge")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gagar.cli", "serve", "--model", str(model), "--port", "0",
         "--served-model-name", "judge", "--max-tokens-cap", "32"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    try:
        deadline = time.time() + 120
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


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_and_chat_completions(server):
    with urllib.request.urlopen(f"{server}/models", timeout=10) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["judge"]
    code, body = _post(server, {"model": "judge", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    assert code == 200
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert 0 < body["usage"]["completion_tokens"] <= 5 and body["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("body, code, words", [
    ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "not served"),
    ({"messages": []}, 400, "non-empty"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": True}, 400, "streaming"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400, "positive"),
])
def test_bad_requests_get_openai_errors(server, body, code, words):
    got, reply = _post(server, body)
    assert got == code and words in reply["error"]["message"]


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
    with pytest.raises(BackendError):
        OpenAIBackend("http://127.0.0.1:9", "judge", timeout=5).chat([{"role": "user", "content": "x"}])


def test_serve_rejects_a_missing_model(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "gagar.cli", "serve", "--model", str(tmp_path / "none")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2 and "cannot load" in proc.stderr
