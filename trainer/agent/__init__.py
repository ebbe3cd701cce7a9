"""The SWE agent: multi-turn tool use inside a sandbox container, or a single turn that answers with a diff.

`run_agent_episodes` / `run_single_turn` take any `RolloutBackend` (the policy) and return `Trajectory`s holding
the exact token ids the policy saw and produced, with a mask that marks the policy's own tokens (the only ones
the trainer trains on) and the final patch.
"""

from __future__ import annotations

from trainer.agent.episode import Trajectory, run_agent_episodes, run_single_turn

__all__ = ["Trajectory", "run_agent_episodes", "run_single_turn"]
