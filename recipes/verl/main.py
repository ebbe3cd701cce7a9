"""verl entry point with gagar's estimators registered in every Ray worker process.

verl runs `compute_advantage` inside its TaskRunner actor, not in this process, so registering the `gapo` and
`gagar` estimators here alone would not reach it. We start Ray ourselves with a worker setup hook that registers
them in every worker; verl's `run_ppo` then sees Ray initialised and reuses it. Usage: see run.sh.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import ray

    from trainer.integrations import verl_plugin

    verl_plugin.register()
    if not ray.is_initialized():
        env_vars = {k: v for k, v in os.environ.items() if k.startswith(("GAGAR_", "DOCKER_HOST"))}
        env_vars["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, runtime_env={
            "worker_process_setup_hook": "trainer.integrations.verl_plugin.register",
            "env_vars": env_vars,
        })
    from verl.trainer import main_ppo

    main_ppo.main()  # hydra parses sys.argv: the overrides from run.sh


if __name__ == "__main__":
    main()
