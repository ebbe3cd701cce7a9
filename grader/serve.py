"""`gagar serve`: a small OpenAI-compatible chat server over a transformers model (+ optional PEFT adapter).

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` (non-streaming), `POST /v1/completions` (token-id or
text prompts; returns the sampled token ids as vLLM does: `token_ids` with `return_token_ids`, `token_id:N`
strings in `logprobs.tokens` with `return_tokens_as_token_ids` — what the trainer's openai rollout backend
trains on), `GET /health`. Requests are served one generation at a time; this is for CPU users and tests,
`vllm serve` is the production path.
Binds 127.0.0.1 by default: there is no authentication, so exposing it is a deliberate `--host` choice.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from grader.backends import BackendError, TransformersBackend

MAX_BODY = 8 << 20


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], backend: TransformersBackend, served_name: str,
                 max_tokens_cap: int) -> None:
        super().__init__(addr, _Handler)
        self.backend = backend
        self.served_name = served_name
        self.max_tokens_cap = max_tokens_cap


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet by default; errors still reach stderr
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send(code, {"error": {"message": message, "type": kind, "code": code}})

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?")[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [
                {"id": self.server.served_name, "object": "model", "created": 0, "owned_by": "gagar"}]})
        elif path == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions"):
            self._error(404, f"no route {self.path}")
            return
        req = self._read_json()
        if req is None:
            return
        if path.endswith("/chat/completions"):
            self._chat(req)
        else:
            self._completion(req)

    def _read_json(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length <= 0 or length > MAX_BODY:
            self._error(400 if length <= 0 else 413, "a JSON body (Content-Length) of at most 8 MiB is required")
            return
        try:
            return json.loads(self.rfile.read(length).decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._error(400, "the body is not valid JSON")
            return None

    def _completion(self, req: Any) -> None:
        problem = _check_completion(req, self.server.served_name)
        if problem:
            self._error(404 if problem.startswith("model") else 400, problem)
            return
        cap = self.server.max_tokens_cap
        try:
            choice, n_prompt = complete(self.server.backend, req, min(int(req.get("max_tokens") or 16), cap))
        except Exception as exc:  # a server must answer, not die, on a generation failure
            self._error(500, f"generation failed: {exc}", "server_error")
            return
        n_out = len(choice["token_ids"])
        if not req.get("return_token_ids"):
            choice.pop("token_ids")
        self._send(200, {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": self.server.served_name, "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        })

    def _chat(self, req: Any) -> None:
        problem = _check_request(req, self.server.served_name)
        if problem:
            self._error(404 if problem.startswith("model") else 400, problem)
            return
        cap = self.server.max_tokens_cap
        max_tokens = min(int(req.get("max_completion_tokens") or req.get("max_tokens") or cap), cap)
        temperature = float(req.get("temperature") or 0.0)
        messages = [{k: v for k, v in m.items() if k in ("role", "content", "name")} for m in req["messages"]]
        try:
            text, n_prompt, n_out = self.server.backend.chat_with_usage(
                messages, max_new_tokens=max_tokens, temperature=temperature
            )
        except BackendError as exc:
            self._error(400, str(exc))
            return
        except Exception as exc:  # a server must answer, not die, on a generation failure
            self._error(500, f"generation failed: {exc}", "server_error")
            return
        self._send(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.server.served_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length" if n_out >= max_tokens else "stop"}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        })


def _check_request(req: Any, served: str) -> str | None:
    if not isinstance(req, dict):
        return "the body must be a JSON object"
    if req.get("stream"):
        return "streaming is not supported by gagar serve; send stream=false"
    model = req.get("model")
    if model not in (None, "", served):
        return f"model {model!r} is not served here; this server serves {served!r}"
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "`messages` must be a non-empty list"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"messages[{i}] needs a string role and string content"
    for key in ("max_tokens", "max_completion_tokens"):
        v = req.get(key)
        if v is not None and (not isinstance(v, int) or v < 1):
            return f"`{key}` must be a positive integer"
    t = req.get("temperature")
    if t is not None and (not isinstance(t, (int, float)) or t < 0):
        return "`temperature` must be a number >= 0"
    return None


def _check_completion(req: Any, served: str) -> str | None:
    if not isinstance(req, dict):
        return "the body must be a JSON object"
    if req.get("stream"):
        return "streaming is not supported by gagar serve; send stream=false"
    if req.get("model") not in (None, "", served):
        return f"model {req.get('model')!r} is not served here; this server serves {served!r}"
    prompt = req.get("prompt")
    if not (isinstance(prompt, str) and prompt) and not (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt)):
        return "`prompt` must be a non-empty string or a list of token ids (one prompt per request)"
    if req.get("n", 1) != 1:
        return "gagar serve samples one completion per request (n=1)"
    v = req.get("max_tokens")
    if v is not None and (not isinstance(v, int) or v < 1):
        return "`max_tokens` must be a positive integer"
    t, p = req.get("temperature"), req.get("top_p")
    if t is not None and (not isinstance(t, (int, float)) or t < 0):
        return "`temperature` must be a number >= 0"
    if p is not None and (not isinstance(p, (int, float)) or not 0 < p <= 1):
        return "`top_p` must be in (0, 1]"
    stop = req.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list)
                                                            and all(isinstance(x, str) for x in stop))):
        return "`stop` must be a string or a list of strings"
    return None


def complete(backend: TransformersBackend, req: dict[str, Any], max_tokens: int) -> tuple[dict[str, Any], int]:
    """One completion choice in vLLM's shape, from the policy-side `generate` (the one sampling path), with
    the sampled token ids (an eos the model sampled included); `logprobs.tokens` as `token_id:N` strings when
    `return_tokens_as_token_ids` is asked for (their log-probs are not computed here: null)."""
    tok = backend.tokenizer
    prompt = req["prompt"]
    ids = prompt if isinstance(prompt, list) else tok(prompt, add_special_tokens=False)["input_ids"]
    stop = [req["stop"]] if isinstance(req.get("stop"), str) else list(req.get("stop") or [])
    (sample,) = backend.generate([ids], max_new_tokens=max_tokens, temperature=float(req.get("temperature", 1.0)),
                                 top_p=float(req.get("top_p", 1.0)), stop=stop or None)
    text = sample.text
    hit = next((s for s in stop if s in text), None)
    if hit is not None and not req.get("include_stop_str_in_output"):
        text = text[: text.index(hit)]
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": sample.finish_reason, "stop_reason": hit,
                              "token_ids": list(sample.token_ids)}
    if req.get("logprobs") is not None:
        as_ids = bool(req.get("return_tokens_as_token_ids"))
        choice["logprobs"] = {"tokens": [f"token_id:{t}" if as_ids else tok.decode([t]) for t in sample.token_ids],
                              "token_logprobs": [None] * len(sample.token_ids)}
    return choice, len(ids)


def make_server(backend: TransformersBackend, host: str = "127.0.0.1", port: int = 8000,
                served_name: str = "judge", max_tokens_cap: int = 2048) -> ChatServer:
    return ChatServer((host, port), backend, served_name, max_tokens_cap)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gagar serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="local path or hub id of a causal LM")
    p.add_argument("--adapter", help="PEFT adapter directory applied on top of --model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    p.add_argument("--served-model-name", default="judge", help="the name clients pass as `model`")
    p.add_argument("--max-tokens-cap", type=int, default=2048, help="upper bound on max_tokens per request")
    args = p.parse_args(argv)
    try:
        backend = TransformersBackend(args.model, args.adapter)
    except (OSError, ValueError, ImportError) as exc:
        print(f"gagar serve: error: cannot load {args.model}: {exc}", file=sys.stderr)
        return 2
    try:
        server = make_server(backend, args.host, args.port, args.served_model_name, args.max_tokens_cap)
    except OSError as exc:
        print(f"gagar serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"gagar serve: serving {args.served_model_name!r} on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
