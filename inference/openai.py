"""Chat completions over any OpenAI-compatible server (`vllm serve --enable-lora`, `gagar serve`, hosted APIs).

Stdlib HTTP only. `chat_batch` sends the conversations concurrently: the server (vLLM) batches them on its side.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from inference.base import BackendError, Messages


class OpenAIBackend:
    """POST /v1/chat/completions; `tool_role="user"` sends tool results as user turns for strict servers."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        tool_role: str = "tool",
        concurrency: int = 16,
    ) -> None:
        url = base_url.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        self.base_url = url
        self.model = model
        self.name = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
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
        body = {
            "model": self.model,
            "messages": self._messages(messages),
            "max_tokens": max_new_tokens,
            "temperature": temperature,
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(
            f"{self.base_url}/chat/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise BackendError(f"{self.base_url}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise BackendError(f"{self.base_url}: {getattr(exc, 'reason', exc)}") from exc
        except json.JSONDecodeError as exc:
            raise BackendError(f"{self.base_url}: the reply is not JSON") from exc
        try:
            content = data["choices"][0]["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BackendError(f"{self.base_url}: unexpected reply shape: {str(data)[:300]}") from exc
        return content or ""

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
