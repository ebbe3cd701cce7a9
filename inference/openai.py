"""Any OpenAI-compatible server (`vllm serve --enable-lora`, `gagar serve`, hosted APIs) through the official
`openai` client — its connection handling, timeouts and retries (connection errors, 408/409/429/5xx, with
backoff) — made in one place, `make_client`, for the judge's chat backend here and the policy's token-id
backend (`trainer.rollout.openai_server`). `chat_batch` sends the conversations concurrently: the server
(vLLM) batches them on its side.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from inference.base import BackendError, Messages


def api_url(base_url: str) -> str:
    """`http://host:8000` or `…/v1` → `…/v1`."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def make_client(base_url: str, *, api_key: str | None = None, timeout: float = 300.0, max_retries: int = 2) -> Any:
    """The `openai.OpenAI` client for `base_url`. A local server needs no key: `OPENAI_API_KEY` when set,
    else a placeholder (the client insists on one)."""
    import openai

    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    return openai.OpenAI(base_url=api_url(base_url), api_key=key or "EMPTY", timeout=timeout,
                         max_retries=max_retries)


def describe_error(exc: Exception, url: str) -> str:
    """An `openai` client error in words: the HTTP status and the server's message, or why it was unreachable."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        detail = (body.get("message") if isinstance(body, dict) else None) or exc.response.text[:500]
        return f"{url}: HTTP {exc.status_code}: {detail}"
    if isinstance(exc, openai.APITimeoutError):
        return f"{url}: no answer within the timeout"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot reach {url}: {exc.__cause__ or exc}"
    return f"{url}: {type(exc).__name__}: {exc}"


class OpenAIBackend:
    """Chat completions; `tool_role="user"` sends tool results as user turns for strict servers."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        tool_role: str = "tool",
        concurrency: int = 16,
        max_retries: int = 2,
    ) -> None:
        self.client = make_client(base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)
        self.base_url = api_url(base_url)
        self.model = model
        self.name = model
        # Some servers reject role "tool" without a tool_call_id: `tool_role="user"` sends results as user turns.
        self.tool_role = tool_role
        self.concurrency = max(1, concurrency)

    def _messages(self, messages: Messages) -> Messages:
        out = []
        for m in messages:
            if m.get("role") == "tool" and self.tool_role != "tool":
                out.append({"role": self.tool_role, "content": f"[{m.get('name', 'tool')} result]\n{m['content']}"})
            else:
                out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
        return out

    def chat(self, messages: Messages, *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        import openai

        try:
            reply = self.client.chat.completions.create(model=self.model, messages=self._messages(messages),
                                                        max_tokens=max_new_tokens, temperature=temperature)
        except openai.OpenAIError as exc:
            raise BackendError(describe_error(exc, self.base_url)) from exc
        if not reply.choices:
            raise BackendError(f"{self.base_url}: a reply without choices")
        return reply.choices[0].message.content or ""

    def chat_batch(
        self, conversations: list[Messages], *, max_new_tokens: int = 512, temperature: float = 0.0
    ) -> list[str | BackendError]:
        def one(msgs: Messages) -> str | BackendError:
            try:
                return self.chat(msgs, max_new_tokens=max_new_tokens, temperature=temperature)
            except BackendError as exc:
                return exc

        if len(conversations) <= 1:
            return [one(m) for m in conversations]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(one, conversations))
