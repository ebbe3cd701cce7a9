"""The OpenAI API surface of `gagar serve`: request schemas, what is honoured or refused, and the responses
built from `openai`'s own types (so a response is what the official client parses).

Honoured: `n`, `stop`, `logprobs`/`top_logprobs` (chat) and `logprobs` (completions), `max_tokens` /
`max_completion_tokens`, `temperature` (default 1.0 on both endpoints, as OpenAI and vLLM), `top_p`, `seed`,
`stream` (+ `stream_options.include_usage`), and vLLM's `top_k`, `skip_special_tokens`,
`include_stop_str_in_output`, `return_token_ids`, `return_tokens_as_token_ids`. Refused with HTTP 400 and an
OpenAI error body naming the parameter, unless at their no-op value: tools and function calling,
`response_format` other than text (both need constrained decoding or a model-specific tool-call parser this
server does not have), penalties, `logit_bias`, `echo`, `suffix`, `best_of` other than `n`, non-text
modalities. Metadata that cannot change what is generated (`user`, `metadata`, ...) is accepted. Any other
field is refused as unrecognized, as OpenAI does — a silently ignored parameter is a silently wrong result.
`null` is "not given" for every parameter with a default, as in OpenAI's API and vLLM.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.base import Sample

DEFAULT_TEMPERATURE = 1.0  # both endpoints, as OpenAI's API and `vllm serve`
MAX_LOGPROBS = 20
MAX_N = 64
MAX_ROWS = 256  # completions per /v1/completions request (prompts × n): one request holds the server for all of them
SEED_RANGE = (-(2**63), 2**63 - 1)  # vLLM's (a torch long); torch.manual_seed refuses what lies beyond
ACCEPTED = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
            "parallel_tool_calls"}  # cannot change what is generated (parallel_tool_calls: only with tools)


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _none(v: Any) -> bool:
    return v in (None, False, 0, 0.0, "", [], {})


# name -> (is the value a no-op?, why it is refused). Checked on the request's extra fields.
_COMMON_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "frequency_penalty": (_none, "penalties are not implemented; leave it at 0"),
    "presence_penalty": (_none, "penalties are not implemented; leave it at 0"),
    "logit_bias": (_none, "logit_bias is not implemented"),
}
CHAT_REFUSED = {
    **_COMMON_REFUSED,
    "tools": (_none, "tool calling needs a model-specific tool-call parser this server does not have; put the tool "
              "protocol in the messages (as gagar's agent and judge do) or use `vllm serve --tool-call-parser`"),
    "tool_choice": (lambda v: v in (None, "none"), "tool calling is not supported (see `tools`)"),
    "functions": (_none, "function calling is not supported (see `tools`)"),
    "function_call": (lambda v: v in (None, "none"), "function calling is not supported (see `tools`)"),
    "response_format": (lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
                        "structured output (json_object, json_schema) needs constrained decoding, which this "
                        "server does not do; ask for JSON in the prompt and validate it"),
    "modalities": (lambda v: v in (None, ["text"]), "only text is generated"),
    "audio": (_none, "only text is generated"),
    "prediction": (_none, "predicted outputs are not supported"),
    "reasoning_effort": (_none, "not a reasoning model setting this server knows"),
    "web_search_options": (_none, "there is no web search here"),
}
COMPLETION_REFUSED = {
    **_COMMON_REFUSED,
    "echo": (_none, "echo is not supported"),
    "suffix": (_none, "suffix (insertion) is not supported"),
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(DEFAULT_TEMPERATURE, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # vLLM's extension; 0 or -1: off
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True  # vLLM's extensions from here on
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """`null` means "not given" (OpenAI's API and vLLM): a field with a default takes it."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items()
                    if not (v is None and k in cls.model_fields and cls.model_fields[k].default is not None)}
        return data

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else [s for s in (self.stop or [])]

    def check(self, refused: dict[str, tuple[Callable[[Any], bool], str]]) -> None:
        for name, value in (self.model_extra or {}).items():
            if name in ACCEPTED:
                continue
            if name not in refused:
                raise ApiError(400, f"unrecognized request argument supplied: {name}", param=name)
            ok, why = refused[name]
            if not ok(value):
                raise ApiError(400, f"`{name}` is not supported by gagar serve: {why}", param=name)
        if any(not s for s in self.stops()):
            raise ApiError(400, "`stop` strings must not be empty", param="stop")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "`stream_options` is only allowed with stream=true", param="stream_options")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def validate_request(self) -> None:
        self.check(CHAT_REFUSED)
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "`top_logprobs` needs `logprobs: true`", param="top_logprobs")

    def conversation(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them (text parts joined; `developer` is a system turn)."""
        out = []
        for i, m in enumerate(self.messages):
            if m.model_extra and set(m.model_extra) & {"tool_calls", "function_call", "audio"}:
                raise ApiError(400, "tool and function calls in messages are not supported (see `tools`)",
                               param=f"messages[{i}]")
            content = m.content
            if isinstance(content, list):
                if not all(p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                    raise ApiError(400, "only text content parts are supported", param=f"messages[{i}].content")
                content = "\n".join(p["text"] for p in content)
            msg = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
            if m.name:
                msg["name"] = m.name
            out.append(msg)
        return out

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1)

    def validate_request(self) -> None:
        self.check(COMPLETION_REFUSED)
        if self.best_of not in (None, self.n):
            raise ApiError(400, "`best_of` other than `n` is not supported (every sample is returned)",
                           param="best_of")
        if not self.prompt or any(isinstance(p, (str, list)) and not p for p in self.prompt_list()):
            raise ApiError(400, "`prompt` must not be empty", param="prompt")
        rows = len(self.prompt_list()) * self.n
        if rows > MAX_ROWS:
            raise ApiError(400, f"{len(self.prompt_list())} prompts × n={self.n} asks for {rows} completions; this "
                           f"server answers at most {MAX_ROWS} per request: split the prompts over several requests",
                           param="prompt")

    def prompt_list(self) -> list[str | list[int]]:
        """One prompt per entry: a string, or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(x, int) for x in p)):
            return [p]
        return list(p)


def invalid_request(errors: list[dict[str, Any]]) -> ApiError:
    """pydantic's errors on a request body as one OpenAI 400 naming the parameter (`messages[0].role`); the
    failures of each member of a union (`prompt` is a string, token ids, or lists of either) become one."""
    def is_tag(x: Any) -> bool:  # pydantic names the union member it tried: `str`, `list[int]`, `literal['a']`
        return isinstance(x, str) and ("[" in x or x in ("str", "int", "float", "bool", "none"))

    first = errors[0]
    loc = [x for x in first.get("loc", ()) if x != "body"]
    keys = [x for x in loc[: next((i for i, x in enumerate(loc) if is_tag(x)), len(loc))]]
    param = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in keys).lstrip(".") or None
    same = [e for e in errors if [x for x in e.get("loc", ()) if x != "body"][: len(keys)] == keys]
    if first["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {first.get('msg')}")
    if len(same) > 1 and len(keys) < len(loc):
        return ApiError(400, f"{param}: not any of the accepted forms ({'; '.join(e['msg'] for e in same)})",
                        param=param)
    return ApiError(400, f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param=param)


# ── responses ────────────────────────────────────────────────────────────────────────────────────────────
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def visible_text(smp: Sample, include_stop: bool, eos_text: str = "") -> str:
    """A sample's text as the API returns it: cut at the stop string it ended on (kept on request). The backend's
    text never holds the eos token's; `eos_text` (its text when special tokens are not skipped) is added only on
    request (`include_stop_str_in_output`), as vLLM does."""
    text = smp.text
    if isinstance(smp.stop_reason, int) and include_stop:
        text += eos_text
    elif isinstance(smp.stop_reason, str):
        i = text.find(smp.stop_reason)
        if i >= 0:
            text = text[: i + (len(smp.stop_reason) if include_stop else 0)]
    return text


def token_str(tokenizer: Any, tid: int, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else tokenizer.decode([tid], clean_up_tokenization_spaces=False)


def chat_logprobs(tokenizer: Any, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]],
                  as_ids: bool) -> Any:
    from openai.types.chat.chat_completion import ChoiceLogprobs
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob

    def entry(tid: int, lp: float) -> dict[str, Any]:
        s = token_str(tokenizer, tid, as_ids)
        return {"token": s, "bytes": list(s.encode("utf-8")), "logprob": lp}

    return ChoiceLogprobs(content=[ChatCompletionTokenLogprob(**entry(t, lp), top_logprobs=[
        TopLogprob(**entry(a, b)) for a, b in top]) for t, lp, top in zip(ids, lps, tops, strict=True)])


def completion_logprobs(tokenizer: Any, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]],
                        as_ids: bool, offset: int = 0) -> Any:
    """Legacy completions' shape: tokens, token_logprobs, top_logprobs (the sampled token always among them,
    as vLLM does) and text_offset."""
    from openai.types.completion_choice import Logprobs

    tokens = [token_str(tokenizer, t, as_ids) for t in ids]
    offsets, pos = [], offset
    for t in ids:
        offsets.append(pos)
        pos += len(tokenizer.decode([t], clean_up_tokenization_spaces=False))
    tops_out = [{**{token_str(tokenizer, a, as_ids): b for a, b in top}, tokens[i]: lps[i]}
                for i, top in enumerate(tops)]
    return Logprobs(tokens=tokens, token_logprobs=lps, top_logprobs=tops_out, text_offset=offsets)


def usage(prompt_tokens: int, completion_tokens: int) -> Any:
    from openai.types import CompletionUsage

    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                           total_tokens=prompt_tokens + completion_tokens)


def dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(mode="json", exclude_unset=True)
