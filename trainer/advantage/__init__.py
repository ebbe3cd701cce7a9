"""The advantage engine: batched GRPO-family and GAPO estimators, GAGAR redistribution, dynamic sampling.
Entry points: `compute_advantages(rewards, estimator=..., index=...)`, `gagar_advantages` / `redistribute`
(GAGAR over graded groups), `register_estimator` (a new estimator by name).

See docs/advantage.md for the formulas, edge cases and integrations (verl, TRL).
"""

from .core import compute_advantages
from .estimators import ESTIMATORS, dr_grpo, gapo, grpo, register_estimator, rloo
from .gagar import (
    DEFAULT_CAP,
    DEFAULT_TIERS,
    FORMS,
    apply_hack_verdicts,
    downweight,
    gagar_advantages,
    needs_grading,
    redistribute,
    weights_for,
    weights_from_ranking,
    weights_from_tiers,
)
from .sampling import mixed_outcome

__all__ = [
    "DEFAULT_CAP",
    "DEFAULT_TIERS",
    "ESTIMATORS",
    "FORMS",
    "apply_hack_verdicts",
    "compute_advantages",
    "downweight",
    "dr_grpo",
    "gagar_advantages",
    "gapo",
    "grpo",
    "mixed_outcome",
    "needs_grading",
    "redistribute",
    "register_estimator",
    "rloo",
    "weights_for",
    "weights_from_ranking",
    "weights_from_tiers",
]
