"""Inference backends behind one small interface: `chat(messages, *, max_new_tokens, temperature) -> str`.

- `TransformersBackend`: in-process Hugging Face model, optionally with a PEFT (LoRA) adapter.
- `OpenAIBackend`: any OpenAI-compatible chat server (`vllm serve`, `gagar serve`, hosted APIs), stdlib HTTP.
- `VLLMBackend`: in-process vLLM, from `grader.backends_vllm`; resolved lazily so only that module imports vllm.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from typing import Any, Protocol, runtime_checkable


class BackendError(RuntimeError):
    """The model could not produce a reply (server down, context overflow, ...); the judge falls back."""


@runtime_checkable
class ChatBackend(Protocol):
    name: str

    def chat(self, messages: list[dict[str, Any]], *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        ...


class TransformersBackend:
    """A causal LM loaded with transformers; `model` is a path, a hub id, or an already loaded model."""

    def __init__(
        self,
        model: Any,
        adapter: str | None = None,
        *,
        tokenizer: Any = None,
        device: str | None = None,
        dtype: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, (str, os.PathLike)):
            self.name = os.path.basename(str(model).rstrip("/")) or str(model)
            kwargs: dict[str, Any] = {}
            if dtype:
                kwargs["dtype"] = getattr(torch, dtype)
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
            self.model = AutoModelForCausalLM.from_pretrained(str(model), **kwargs)
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer along with an already loaded model")
            self.name = getattr(getattr(model, "config", None), "_name_or_path", "") or "model"
            self.model, self.tokenizer = model, tokenizer
        if adapter:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.model, str(adapter))
            self.name += "+" + os.path.basename(str(adapter).rstrip("/"))
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.model.eval()
        self._lock = threading.Lock()  # one generate at a time: the server is threaded
        cfg = getattr(self.model, "config", None)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0)

    def chat(self, messages: list[dict[str, Any]], *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        return self.chat_with_usage(messages, max_new_tokens=max_new_tokens, temperature=temperature)[0]

    def chat_with_usage(
        self, messages: list[dict[str, Any]], *, max_new_tokens: int = 512, temperature: float = 0.0
    ) -> tuple[str, int, int]:
        """Reply text plus (prompt tokens, completion tokens), for servers that report usage."""
        import torch

        try:
            enc = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
        except Exception as exc:  # templates raise on roles or shapes they do not support
            raise BackendError(f"the chat template rejected the conversation: {exc}") from exc
        ids = enc["input_ids"]
        n_prompt = int(ids.shape[-1])
        if self.max_positions and n_prompt + max_new_tokens > self.max_positions:
            room = self.max_positions - n_prompt
            if room < 16:
                raise BackendError(f"conversation of {n_prompt} tokens exceeds the model's {self.max_positions}")
            max_new_tokens = room
        gen: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            gen["temperature"] = temperature
        if self.tokenizer.pad_token_id is not None:
            gen["pad_token_id"] = self.tokenizer.pad_token_id
        with self._lock, torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=enc["attention_mask"].to(self.device), **gen
            )
        new = out[0, n_prompt:]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return text, n_prompt, int(new.shape[-1])


class OpenAIBackend:
    """POST /v1/chat/completions on an OpenAI-compatible server (e.g. `vllm serve --enable-lora`)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        tool_role: str = "tool",
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

    def _messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in messages:
            if m.get("role") == "tool" and self.tool_role != "tool":
                out.append({"role": self.tool_role, "content": f"[{m.get('name', 'tool')} result]\n{m['content']}"})
            else:
                out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
        return out

    def chat(self, messages: list[dict[str, Any]], *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
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


def make_backend(
    kind: str, model: str | None, *, adapter: str | None = None, base_url: str | None = None
) -> ChatBackend:
    """Build a backend from CLI-style options; raises ValueError with an actionable message."""
    if kind == "transformers":
        if not model:
            raise ValueError("--judge llm with --backend transformers needs --model PATH_OR_ID")
        return TransformersBackend(model, adapter)
    if kind == "openai":
        if not base_url or not model:
            raise ValueError("--backend openai needs --base-url URL and --model NAME (the server's model name)")
        if adapter:
            raise ValueError("--adapter is not used with --backend openai: serve the adapter (vllm --lora-modules)")
        return OpenAIBackend(base_url, model)
    if kind == "vllm":
        if not model:
            raise ValueError("--backend vllm needs --model PATH_OR_ID")
        from grader.backends_vllm import VLLMBackend

        return VLLMBackend(model, adapter)
    raise ValueError(f"unknown backend {kind!r}; choose transformers, openai or vllm")


def __getattr__(name: str) -> Any:
    # `grader.backends.VLLMBackend` resolves lazily so importing this module never imports vllm.
    if name == "VLLMBackend":
        from grader.backends_vllm import VLLMBackend

        return VLLMBackend
    raise AttributeError(name)
