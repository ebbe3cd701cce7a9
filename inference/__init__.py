"""Model backends shared by the judge (grader) and the policy (trainer): one place, one set of classes.

Two interfaces over the same engines:

- chat (the judge): `chat(messages) -> str` and `chat_batch(conversations) -> list[str | BackendError]`, which
  answers many conversations in one forward batch (a failure of one conversation does not fail the others);
- tokens (the policy): `generate(prompts: list[list[int]], ...) -> list[Sample]` with the sampled token ids, and
  `sync_weights(model, step)` after each policy update.

Backends: `TransformersBackend` (in-process Hugging Face model, optional PEFT adapter, left-padded batches),
`VLLMBackend` (in-process vLLM), `OpenAIBackend` (chat over any OpenAI-compatible
server) and, for the policy, `trainer.rollout.openai_server.OpenAIServerBackend` (token-id completions + LoRA
hot-loading). `inference.backends.make_backend` builds any of them from CLI/config options. Also here: the pinned
model registry (`inference.models`, `gagar model pull|ls`) and the OpenAI-compatible server (`inference.serve`,
`gagar serve`).
"""

from __future__ import annotations

from inference.backends import make_backend
from inference.base import BackendError, ChatBackend, RolloutBackend, Sample, chat_batch

__all__ = ["BackendError", "ChatBackend", "RolloutBackend", "Sample", "chat_batch", "make_backend"]
