"""The backend protocols, the sample record and `chat_batch` (the factory is `inference.backends`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Messages = list[dict[str, Any]]


class BackendError(RuntimeError):
    """The model could not produce a reply (server down, context overflow, ...); the judge falls back."""


@dataclass
class Sample:
    token_ids: list[int]  # the completion only, as sampled (eos included when the model emitted it)
    text: str  # decoded token_ids, without the eos token's text (as vLLM)
    finish_reason: str  # "stop" (eos or a stop string) | "length"
    # The sampled tokens' log-probs as the engine reports them (None: not asked for, or not given). From
    # `TransformersBackend.sample` with SamplingParams.logprobs: under the model's raw distribution, or with
    # logprobs_mode="processed" under the one sampled from (after temperature, top-k, top-p: vLLM's
    # processed_logprobs); plus the `logprobs` most likely (token id, log-probability) of each step. The trainer
    # reads a rollout's as log π_sampler (truncated importance sampling): the sampling distribution's, so a server
    # feeding it runs in processed mode (vLLM: --logprobs-mode processed_logprobs; gagar serve's default).
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    stop_reason: str | int | None = None  # the stop string matched, or the eos id; None at the length limit


@dataclass
class SamplingParams:
    """How to sample one completion per prompt (`TransformersBackend.sample`)."""

    max_new_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop: list[str] | None = None  # a row stops after the token that completes one (kept in `text`)
    logprobs: int | None = None  # None: none; k >= 0: the sampled token's, plus the k most likely
    seed: int | None = None  # the same seed, prompts and parameters give the same samples
    skip_special_tokens: bool = True  # for `text`
    logprobs_mode: str = "raw"  # raw: the model's distribution | processed: after temperature, top-k, top-p
    # False: exactly the distribution above, whatever the checkpoint's generation_config says (the policy, the
    # server). True: the checkpoint's own decoding defaults fill what is not set here (the judge's chat replies).
    model_defaults: bool = False


@runtime_checkable
class ChatBackend(Protocol):
    name: str

    def chat(self, messages: Messages, *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        ...


class RolloutBackend(Protocol):
    name: str

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        stop: list[str] | None = None,
    ) -> list[Sample]:
        """One completion per prompt (callers repeat a prompt n times for a group)."""
        ...

    def sync_weights(self, model: Any, step: int) -> None:
        """Make the engine sample from `model`'s current weights (no-op when it shares them)."""
        ...


def chat_batch(
    backend: ChatBackend, conversations: Sequence[Messages], *, max_new_tokens: int = 512, temperature: float = 0.0
) -> list[str | BackendError]:
    """Replies to many conversations: one batch where the backend batches, else one call each.

    A `BackendError` comes back in the place of the conversation it concerns, so one over-long conversation
    does not cost the others their replies.
    """
    batched = getattr(backend, "chat_batch", None)
    if callable(batched):
        return list(batched(list(conversations), max_new_tokens=max_new_tokens, temperature=temperature))
    out: list[str | BackendError] = []
    for msgs in conversations:
        try:
            out.append(backend.chat(msgs, max_new_tokens=max_new_tokens, temperature=temperature))
        except BackendError as exc:
            out.append(exc)
    return out
