"""A conversation as the exact token sequence the policy saw, with a mask of the tokens the policy produced.

Each turn the policy continues `ids` directly (never a re-rendered text), so the trained tokens are the sampled
ones. Everything the environment adds (system, user, tool results, the chat template's own markers) is rendered
with the tokenizer's chat template and appended with mask 0.
"""

from __future__ import annotations

from typing import Any


class Conversation:
    def __init__(self, tokenizer: Any, messages: list[dict]) -> None:
        self.tok = tokenizer
        self.messages = list(messages)
        text = self._render(self.messages, gen=True)
        self.ids: list[int] = self._encode(text)
        self.mask: list[int] = [0] * len(self.ids)
        self.prompt_len = len(self.ids)
        # log π_sampler of every token as the engine reported it (0 for the environment's); None as soon as one
        # policy turn came without them (the transformers backend: the sampler is the trainer's own model)
        self.logprobs: list[float] | None = [0.0] * len(self.ids)
        self._seen_text = text  # the rendered text `ids` stands for, up to the last environment turn
        self._last_eos = False

    def _render(self, messages: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def add_policy(self, token_ids: list[int], text: str, logprobs: list[float] | None = None) -> None:
        self.ids += token_ids
        self.mask += [1] * len(token_ids)
        if self.logprobs is not None:
            self.logprobs = self.logprobs + list(logprobs) if logprobs and len(logprobs) == len(token_ids) else None
        self.messages.append({"role": "assistant", "content": text})
        eos = self.tok.eos_token_id
        self._last_eos = bool(token_ids) and token_ids[-1] == eos
        self._seen_text += text + (self.tok.eos_token if self._last_eos else "")

    def add_env(self, message: dict) -> None:
        """Append an environment message (tool result or user) and the generation prompt after it."""
        self.messages.append(message)
        full = self._render(self.messages, gen=True)
        if full.startswith(self._seen_text):
            delta = full[len(self._seen_text):]
        else:
            # Templates that rewrite earlier assistant text (e.g. strip reasoning) break the prefix property;
            # then the closing markup is recovered from the rendering of the assistant message alone.
            before = self._render(self.messages[:-1], gen=False)
            delta = full[len(before):] if full.startswith(before) else full[-len(self._render([message], True)):]
            if not self._last_eos and self.tok.eos_token:
                delta = self.tok.eos_token + delta
        ids = self._encode(delta)
        self.ids += ids
        self.mask += [0] * len(ids)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(ids)
        self._seen_text = full

    def sampler_logprobs(self) -> list[float] | None:
        """Aligned with the trainer's scores: entry t is token t+1's (as `Trajectory.old_logprobs`)."""
        return None if self.logprobs is None else self.logprobs[1:]

    def __len__(self) -> int:
        return len(self.ids)
