"""Sampling from an OpenAI-compatible server (e.g. `vllm serve MODEL --enable-lora`).

Prompts go to `/v1/completions` as token ids (vLLM accepts them), so the server continues exactly the
conversation the trainer tokenised. After each update the LoRA adapter is saved where the server can read it
(a shared path) and loaded with vLLM's runtime endpoint `/v1/load_lora_adapter` (start the server with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`); the next requests name that adapter as their model.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.rollout.base import Sample


class OpenAIServerBackend:
    name = "openai"

    def __init__(self, base_url: str, model: str, tokenizer: Any, work_dir: str, *, lora: bool = True,
                 timeout: float = 600.0, concurrency: int = 16) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.base_model = model
        self.model = model
        self.tokenizer = tokenizer
        self.work_dir = Path(work_dir)
        self.lora = lora
        self.timeout = timeout
        self.concurrency = concurrency

    def _post(self, path: str, payload: dict) -> Any:
        req = urllib.request.Request(
            self.base_url + path, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{self.base_url}{path}: HTTP {exc.code}: {exc.read().decode()[:500]}") from exc
        except urllib.error.URLError as exc:
            raise RuntimeError(f"cannot reach the rollout server at {self.base_url}: {exc.reason}") from exc
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body

    def _one(self, prompt: list[int], max_new_tokens: int, temperature: float, top_p: float,
             stop: list[str] | None) -> Sample:
        payload = {"model": self.model, "prompt": prompt, "max_tokens": max_new_tokens,
                   "temperature": temperature, "top_p": top_p, "n": 1, "skip_special_tokens": True}
        if stop:
            payload.update(stop=stop, include_stop_str_in_output=True)
        choice = self._post("/completions", payload)["choices"][0]
        text = choice.get("text") or ""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if finish == "stop" and not (stop and any(text.endswith(s) for s in stop)) and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)  # the server strips the eos it sampled; train on it
        return Sample(token_ids=ids, text=text, finish_reason=finish)

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 stop: list[str] | None = None) -> list[Sample]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._one(p, max_new_tokens, temperature, top_p, stop), prompts))

    def sync_weights(self, model: Any, step: int) -> None:
        if not self.lora:
            raise RuntimeError("the openai rollout backend can only receive LoRA adapters; set lora.enabled: true")
        path = (self.work_dir / "served_adapters" / f"step_{step:06d}").resolve()
        model.save_pretrained(str(path))
        name = f"gagar-step-{step}"
        self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        if self.model != self.base_model:
            try:
                self._post("/unload_lora_adapter", {"lora_name": self.model})
            except RuntimeError:
                pass  # an adapter the server already dropped is not worth failing a run over
        self.model = name
