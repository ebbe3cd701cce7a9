"""Rollout backends: turn token-id prompts into sampled completions, and receive the policy's new weights.

`make_backend(cfg, model, tokenizer)` picks one by `rollout.backend`. Every backend returns completion token
ids, because the trainer trains on exactly the tokens that were sampled (re-tokenising text can differ).
"""

from __future__ import annotations

from inference.base import RolloutBackend, Sample
from trainer.rollout.backends import make_backend

__all__ = ["RolloutBackend", "Sample", "make_backend"]
