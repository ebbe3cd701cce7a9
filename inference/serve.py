"""`gagar serve`: an OpenAI-compatible server (FastAPI + uvicorn) over a transformers model (+ PEFT adapter).

Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (text or token-id prompts, one or many; the
sampled token ids come back as vLLM returns them: `token_ids` with `return_token_ids`, `token_id:N` strings
with `return_tokens_as_token_ids` — what the trainer's openai rollout backend trains on), `GET /v1/models`,
`GET /v1/models/{id}`, `GET /health`. What each request parameter does, and which are refused with HTTP 400,
is in `inference.serve_api`. `stream=true` answers with server-sent events in OpenAI's chunk format, ending with
`data: [DONE]`, as `vllm serve` does.

The model is a registry model name (`gagar model ls`, pulled on first use), a local Hugging Face directory or a
hub id (`--model`), optionally with a PEFT adapter on top (`--adapter`), served under `--served-model-name`
(default: `--model` as given, as vLLM does, `+ADAPTER` added with an adapter). A request's n samples (and a completions request's prompts) are generated as one left-padded
batch; requests are served one at a time (`TransformersBackend` holds one lock), so a `seed` reproduces a
sample whatever else the server does. This is for CPU users, tests and small models: `vllm serve` is the
production path. Binds 127.0.0.1 by default: there is no authentication, so exposing it is a deliberate
`--host` choice.
"""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from inference.base import BackendError, Sample, SamplingParams
from inference.serve_api import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    chat_logprobs,
    completion_logprobs,
    dump,
    invalid_request,
    new_id,
    now,
    usage,
    visible_text,
)


class Engine:
    """The backend behind the endpoints: request → prompts and sampling parameters → samples."""

    def __init__(self, backend: Any, served_name: str, max_tokens_cap: int, logprobs_mode: str = "processed") -> None:
        self.backend, self.served_name, self.cap, self.logprobs_mode = backend, served_name, max_tokens_cap, logprobs_mode
        self.tokenizer = backend.tokenizer
        self.vocab = int(getattr(getattr(backend.model, "config", None), "vocab_size", 0) or len(self.tokenizer))
        self.created = now()

    def check_model(self, name: str | None) -> None:
        if name not in (None, "", self.served_name):
            raise ApiError(404, f"the model `{name}` does not exist; this server serves `{self.served_name}`",
                           param="model", code="model_not_found")

    def max_new(self, prompts: list[list[int]], asked: int | None, default: int | None, what: str) -> int:
        """The completion length: `asked`, within the cap and the model's context (else a 400 naming why)."""
        room = (self.backend.max_positions - max(map(len, prompts))) if self.backend.max_positions else None
        if room is not None and room < 1:
            raise ApiError(400, f"the {what} is {max(map(len, prompts))} tokens; this model's context is "
                           f"{self.backend.max_positions}", param=what)
        if asked is None:
            return min(x for x in (default, self.cap, room) if x is not None)
        if asked > self.cap:
            raise ApiError(400, f"max_tokens {asked} is above this server's cap of {self.cap} (--max-tokens-cap)",
                           param="max_tokens")
        if room is not None and asked > room:
            raise ApiError(400, f"this model's context is {self.backend.max_positions} tokens: the {what} takes "
                           f"{max(map(len, prompts))}, leaving {room}, and {asked} were asked for",
                           param="max_tokens")
        return asked

    def params(self, req: Any, max_new: int, logprobs: int | None) -> SamplingParams:
        return SamplingParams(max_new_tokens=max_new, temperature=req.temperature, top_p=req.top_p,
                              top_k=max(0, req.top_k), stop=req.stops() or None, logprobs=logprobs, seed=req.seed,
                              skip_special_tokens=req.skip_special_tokens, logprobs_mode=self.logprobs_mode)

    def chat_prompt(self, req: ChatRequest) -> list[int]:
        try:
            return self.backend.encode_chat(req.conversation())
        except BackendError as exc:
            raise ApiError(400, str(exc), param="messages") from exc

    def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        out = []
        for p in req.prompt_list():
            ids = self.tokenizer(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p)
            if any(not 0 <= t < self.vocab for t in ids):
                raise ApiError(400, f"token ids must be in [0, {self.vocab})", param="prompt")
            out.append(ids)
        return out

    def text(self, smp: Sample, req: Any) -> str:
        """A sample's text as the API returns it (`visible_text`, with the eos token's text for the request)."""
        eos = ("" if req.skip_special_tokens or not isinstance(smp.stop_reason, int)
               else self.tokenizer.decode([smp.stop_reason], skip_special_tokens=False))
        return visible_text(smp, req.include_stop_str_in_output, eos)

    def run(self, prompts: list[list[int]], params: SamplingParams, **kw: Any) -> list[Sample]:
        try:
            return self.backend.sample(prompts, params, **kw)
        except BackendError as exc:
            raise ApiError(400, str(exc)) from exc
        except Exception as exc:  # a server must answer, not die, on a generation failure
            raise ApiError(500, f"generation failed: {type(exc).__name__}: {exc}", kind="server_error") from exc


# ── non-streaming ────────────────────────────────────────────────────────────────────────────────────────
def chat_response(eng: Engine, req: ChatRequest, prompt: list[int], samples: list[Sample]) -> dict[str, Any]:
    from openai.types.chat import ChatCompletion, ChatCompletionMessage
    from openai.types.chat.chat_completion import Choice

    choices = []
    for i, s in enumerate(samples):
        lp = (chat_logprobs(eng.tokenizer, s.token_ids, s.logprobs or [], s.top_logprobs or [],
                            req.return_tokens_as_token_ids) if req.logprobs else None)
        choices.append(Choice(index=i, finish_reason=s.finish_reason, logprobs=lp, message=ChatCompletionMessage(
            role="assistant", content=eng.text(s, req))))
    out = ChatCompletion(id=new_id("chatcmpl"), object="chat.completion", created=now(), model=eng.served_name,
                         choices=choices, usage=usage(len(prompt), sum(len(s.token_ids) for s in samples)))
    return dump(out)


def completion_response(eng: Engine, req: CompletionRequest, prompts: list[list[int]],
                        samples: list[Sample]) -> dict[str, Any]:
    from openai.types import Completion, CompletionChoice

    choices = []
    for i, s in enumerate(samples):
        extra: dict[str, Any] = {"stop_reason": s.stop_reason}
        if req.return_token_ids:
            extra["token_ids"] = list(s.token_ids)
        lp = (completion_logprobs(eng.tokenizer, s.token_ids, s.logprobs or [], s.top_logprobs or [],
                                  req.return_tokens_as_token_ids) if req.logprobs is not None else None)
        choices.append(CompletionChoice(index=i, text=eng.text(s, req),
                                        finish_reason=s.finish_reason, logprobs=lp, **extra))
    out = Completion(id=new_id("cmpl"), object="text_completion", created=now(), model=eng.served_name,
                     choices=choices, usage=usage(sum(map(len, prompts)), sum(len(s.token_ids) for s in samples)))
    return dump(out)


# ── streaming (server-sent events) ───────────────────────────────────────────────────────────────────────
class _Stream:
    """Generation on its own thread; each sampled token becomes a chunk. Text is released as soon as it can
    no longer turn into a stop string (or end mid-character), so what streams equals the non-streamed text."""

    def __init__(self, eng: Engine, req: Any, prompts: list[list[int]], params: SamplingParams, chat: bool,
                 prompt_tokens: int) -> None:
        self.eng, self.req, self.prompts, self.params, self.chat = eng, req, prompts, params, chat
        self.prompt_tokens = prompt_tokens
        self.n = len(prompts)
        self.q: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now()
        self.hold = max((len(s) for s in params.stop or []), default=1) - 1
        self.sent = [0] * self.n
        self.ntok = [0] * self.n
        threading.Thread(target=self._generate, name="gagar-serve-stream", daemon=True).start()

    def _generate(self) -> None:
        def on_token(i: int, row: Any) -> None:
            k = len(row.token_ids)
            self.q.put(("token", i, row.text, k, row.token_ids[-1] if k else None,
                        row.logprobs[-1] if row.logprobs else None, row.top_logprobs[-1] if row.top_logprobs else [],
                        row.finish, row.stop_reason))

        try:
            self.q.put(("end", self.eng.run(self.prompts, self.params, on_token=on_token, cancel=self.cancel)))
        except ApiError as exc:
            self.q.put(("error", exc))

    def _visible(self, text: str, finish: str | None, stop_reason: Any) -> str:
        if finish is None:
            text = text[: max(0, len(text) - self.hold)]
            return text.rstrip("\ufffd")  # a character whose bytes are not all sampled yet
        return self.eng.text(Sample([], text, finish, stop_reason=stop_reason), self.req)

    def _chunk(self, choices: list[dict[str, Any]], usage_: Any = None) -> str:
        from openai.types.chat import ChatCompletionChunk

        fields: dict[str, Any] = {"id": self.id, "created": self.created, "model": self.eng.served_name,
                                  "object": "chat.completion.chunk" if self.chat else "text_completion",
                                  "choices": choices}
        if self.req.stream_options and self.req.stream_options.include_usage:
            fields["usage"] = usage_
        if self.chat:
            body = dump(ChatCompletionChunk(**fields))
        else:  # openai's `Completion` has no null finish_reason, which every chunk but the last one carries
            body = {**fields, **({"usage": dump(usage_) if usage_ is not None else None} if "usage" in fields else {})}
        return f"data: {json.dumps(body)}\n\n"

    def _choice(self, i: int, delta: str, finish: str | None, tok: tuple | None) -> dict[str, Any]:
        as_ids, tk = self.req.return_tokens_as_token_ids, self.eng.tokenizer
        lp = None
        if tok is not None and self.params.logprobs is not None:
            tid, logp, top = tok
            lp = dump(chat_logprobs(tk, [tid], [logp], [top], as_ids) if self.chat
                      else completion_logprobs(tk, [tid], [logp], [top], as_ids, offset=self.sent[i]))
        if self.chat:
            return {"index": i, "delta": {"content": delta} if delta else {}, "logprobs": lp, "finish_reason": finish}
        return {"index": i, "text": delta, "logprobs": lp, "finish_reason": finish}

    async def events(self) -> AsyncIterator[str]:
        try:
            try:
                async for chunk in self._chunks():
                    yield chunk
            except Exception as exc:  # noqa: BLE001 - the status line is sent: say it in the stream, as vLLM does
                err = ApiError(500, f"streaming failed: {type(exc).__name__}: {exc}", kind="server_error")
                yield f"data: {json.dumps(err.body())}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.cancel.set()  # the client went away (or we are done): stop generating

    async def _chunks(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        if self.chat:
            yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None} for i in range(self.n)])
        while True:
            item = await loop.run_in_executor(None, self.q.get)
            if item[0] == "error":
                yield f"data: {json.dumps(item[1].body())}\n\n"
                return
            if item[0] == "end":
                if self.req.stream_options and self.req.stream_options.include_usage:
                    yield self._chunk([], usage(self.prompt_tokens, sum(len(s.token_ids) for s in item[1])))
                return
            _, i, text, k, tid, logp, top, finish, stop_reason = item
            if finish == "abort":
                continue
            tok = (tid, logp, top) if k > self.ntok[i] and logp is not None else None
            self.ntok[i] = k
            vis = self._visible(text, finish, stop_reason)
            delta = vis[self.sent[i]:]
            if delta or tok is not None:
                yield self._chunk([self._choice(i, delta, None, tok)])
                self.sent[i] = max(self.sent[i], len(vis))
            if finish is not None:
                yield self._chunk([self._choice(i, "", finish, None)])


# ── the app ──────────────────────────────────────────────────────────────────────────────────────────────
def make_app(backend: Any, served_name: str | None = None, max_tokens_cap: int = 2048,
             logprobs_mode: str = "processed") -> Any:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from openai.types import Model
    from starlette.exceptions import HTTPException

    served_name = served_name or backend.name
    eng = Engine(backend, served_name, max_tokens_cap, logprobs_mode)
    app = FastAPI(title="gagar serve", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(invalid_request(exc.errors()).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").body(),
                            status_code=exc.status_code)

    def model_card() -> dict[str, Any]:
        return dump(Model(id=served_name, object="model", created=eng.created, owned_by="gagar"))

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    def retrieve_model(model_id: str) -> dict[str, Any]:
        eng.check_model(model_id)
        return model_card()

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> Any:
        eng.check_model(req.model)
        req.validate_request()
        prompt = eng.chat_prompt(req)
        params = eng.params(req, eng.max_new([prompt], req.limit(), None, "messages"), req.wanted_logprobs())
        prompts = [prompt] * req.n
        if req.stream:
            return StreamingResponse(_Stream(eng, req, prompts, params, True, len(prompt)).events(),
                                     media_type="text/event-stream")
        return chat_response(eng, req, prompt, eng.run(prompts, params))

    @app.post("/v1/completions")
    def completions(req: CompletionRequest) -> Any:
        eng.check_model(req.model)
        req.validate_request()
        prompts = eng.completion_prompts(req)
        # OpenAI's default length for legacy completions is 16 tokens
        params = eng.params(req, eng.max_new(prompts, req.max_tokens, 16, "prompt"), req.logprobs)
        rows = [p for p in prompts for _ in range(req.n)]  # choice index = prompt index * n + sample
        if req.stream:
            return StreamingResponse(_Stream(eng, req, rows, params, False, sum(map(len, prompts))).events(),
                                     media_type="text/event-stream")
        return completion_response(eng, req, prompts, eng.run(rows, params))

    return app


class Server:
    """`gagar serve` on a socket (port 0: a free one), run by uvicorn: `serve_forever()` (blocks; from a
    thread too), `shutdown()`, `server_address`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 8000) -> None:
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, reuse_port=False)
        self.server_address = self.sock.getsockname()[:2]
        self._uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))

    def serve_forever(self) -> None:
        self._uv.run(sockets=[self.sock])

    def shutdown(self) -> None:
        self._uv.should_exit = True


def make_server(backend: Any, host: str = "127.0.0.1", port: int = 8000, served_name: str | None = None,
                max_tokens_cap: int = 2048, logprobs_mode: str = "processed") -> Server:
    """The server of `backend`, whose model clients name `served_name` (default: the backend's name)."""
    return Server(make_app(backend, served_name or backend.name, max_tokens_cap, logprobs_mode), host, port)


def default_served_name(model: str, adapter: str | None) -> str:
    """The name clients pass as `model` when --served-model-name is not given: --model as typed (vLLM's rule),
    with the adapter's folder name after a `+` when one is applied (the base alone is not what is served)."""
    return model + (f"+{Path(adapter).name or adapter}" if adapter else "")


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="gagar serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a registry model name (`gagar model ls`; pulled on first use), a "
                   "local Hugging Face model directory, or a hub id")
    p.add_argument("--adapter", help="PEFT adapter directory applied on top of --model")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (no authentication: expose it deliberately)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    p.add_argument("--served-model-name", help="the name clients pass as `model` (default: --model as given, "
                   "+ADAPTER when --adapter is given, as vLLM names a model after --model)")
    p.add_argument("--max-tokens-cap", type=int, default=2048, help="upper bound on max_tokens per request")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="weights dtype (default: the model's)")
    p.add_argument("--batch-size", type=int, default=16, help="rows per forward batch (n samples × prompts)")
    p.add_argument("--logprobs-mode", choices=["raw_logprobs", "processed_logprobs"], default="processed_logprobs",
                   help="processed_logprobs (default): log-probs of the distribution sampled from, after "
                   "temperature/top-k/top-p, which the trainer's importance-sampling correction needs; raw_logprobs: "
                   "the model's own distribution (vLLM's default; for scoring text)")
    args = p.parse_args(argv)
    if args.max_tokens_cap < 1 or args.batch_size < 1:
        print("gagar serve: error: --max-tokens-cap and --batch-size must be at least 1", file=sys.stderr)
        return 2
    from inference.hf import TransformersBackend
    from inference.models import REGISTRY, ModelError, resolve_model

    name = args.served_model_name or default_served_name(args.model, args.adapter)
    try:
        path = resolve_model(args.model)  # a registry name → its pulled directory, as training and the judge do
        backend = TransformersBackend(path, args.adapter, device=args.device, dtype=args.dtype,
                                      batch_size=args.batch_size)
    except ModelError as exc:
        print(f"gagar serve: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, ImportError) as exc:
        hint = "" if Path(args.model).expanduser().exists() else (
            f" (--model is neither a local directory nor a registry model — `gagar model ls` lists those: "
            f"{', '.join(sorted(REGISTRY))}; `gagar model pull NAME` fetches one — so it was tried as a hub id)")
        print(f"gagar serve: error: cannot load {args.model}: {exc}{hint}", file=sys.stderr)
        return 2
    try:
        server = make_server(backend, args.host, args.port, name, args.max_tokens_cap,
                             args.logprobs_mode.removesuffix("_logprobs"))
    except OSError as exc:
        print(f"gagar serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"gagar serve: serving {name!r} on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
