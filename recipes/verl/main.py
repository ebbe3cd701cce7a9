"""verl entry point for GAGAR: verl's PPO loop with `GagarRayPPOTrainer` (trainer/integrations/verl_trainer.py).

verl runs the advantage step inside its TaskRunner actor and rewards inside reward-loop workers, not in this
process, so every Ray worker needs this repo on its path and the `gapo`/`gagar` estimators registered: we add
both to the Ray runtime env that verl's `run_ppo` starts Ray with (its own env vars kept), then hand the composed
config to `verl_trainer.run`, which is verl's `main_ppo.main` with our TaskRunner. Usage: see run.sh.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig, open_dict  # noqa: E402


def add_runtime_env(config: DictConfig) -> None:
    """Our path, GAGAR_*/DOCKER_HOST env vars and the estimator registration hook, for every Ray worker."""
    env_vars = {k: v for k, v in os.environ.items() if k.startswith(("GAGAR_", "DOCKER_HOST"))}
    env_vars["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with open_dict(config):
        runtime_env = config.ray_kwargs.ray_init.setdefault("runtime_env", {})
        runtime_env.setdefault("env_vars", {}).update(env_vars)
        runtime_env["worker_process_setup_hook"] = "trainer.integrations.verl_plugin.register"


@hydra.main(config_path=None, config_name=None, version_base=None)  # run.sh passes --config-path/--config-name
def main(config: DictConfig) -> None:
    from trainer.integrations import verl_plugin, verl_trainer

    verl_plugin.register()
    add_runtime_env(config)
    verl_trainer.run(config)


if __name__ == "__main__":
    main()
