"""Where the trainer's patches are evaluated: the sandbox executor named in the config (`sandbox.executor`).

`local` runs `evaluate_predictions` in-process on this machine's Docker engine; `ray` spreads each step's
predictions over a Ray cluster (`sandbox.ray_address`; none: a local Ray for the run), one sandbox actor per
node, whole groups per node — the same executor as `gagar eval --executor ray` and the verl recipe's reward.
The executor (and a Ray it started) lives as long as the pool: `close()`, or at interpreter exit.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from pathlib import Path

from sandbox.config import SandboxConfig
from sandbox.executor import make_executor
from sandbox.records import EvalResult, Instance, Prediction
from trainer.config import SandboxSection


class SandboxPool:
    def __init__(self, section: SandboxSection, repos_dir: Path, run_id: str = "gagar-train") -> None:
        self.section = section
        self.repos_dir = Path(repos_dir)
        self.run_id = run_id
        if section.image and section.executor == "local":  # else every rollout would be a masked infra_error
            from sandbox.run import image_missing

            missing = image_missing(section.image, override=True)
            if missing:
                raise ValueError(missing.replace("--image", "sandbox.image", 1))
        self.executor = make_executor(section.executor, section.ray_address or None)
        atexit.register(self.close)

    def config(self) -> SandboxConfig:
        s = self.section
        return SandboxConfig(repos_dir=self.repos_dir, image=s.image, memory=s.memory, cpus=s.cpus,
                             timeout=s.timeout, max_workers=s.max_workers, run_id=self.run_id,
                             runtime=s.runtime or None)

    def evaluate(self, instances: dict[str, Instance], predictions: list[Prediction],
                 run_dir: Path) -> list[EvalResult]:
        if not predictions:
            return []
        # redo: every batch the trainer evaluates is new rollouts. Its run dirs (OUT/sandbox/step_N/rK) are
        # logs, never a cache: a fresh run into an existing --out (or a resumed one re-sampling the step after
        # its checkpoint) reuses the same dirs and rollout ids, and must not inherit the earlier run's verdicts.
        return self.executor.evaluate(instances, predictions, self.config(), run_dir=Path(run_dir), redo=True)

    def evaluate_masked(self, instances: dict[str, Instance], predictions: list[Prediction], run_dir: Path,
                        log: Callable[[str], None] = print) -> list[EvalResult]:
        """`evaluate`, except that a failure of the evaluation itself (engine gone, a node lost) never aborts a
        training step: every prediction then gets `infra_error` with the reason, which the trainer masks out of
        the loss instead of scoring it as a failed rollout."""
        try:
            return self.evaluate(instances, predictions, run_dir)
        except (OSError, RuntimeError, ValueError) as exc:
            log(f"sandbox: evaluation failed ({exc}); {len(predictions)} rollout(s) masked as infra_error")
            return [EvalResult(instance_id=p.instance_id, model_name_or_path=p.model_name_or_path,
                               rollout_id=p.rollout_id, status="infra_error", error=f"sandbox failed: {exc}")
                    for p in predictions]

    def close(self) -> None:
        self.executor.close()
