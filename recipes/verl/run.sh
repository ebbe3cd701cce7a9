#!/usr/bin/env bash
# GAGAR in verl 0.9.1 on Ray, across nodes, with the Docker sandbox as the reward and GagarRayPPOTrainer
# (trainer/integrations/verl_trainer.py) grading each group's passing patches before the advantage.
# Needs its own environment with verl's pins (verl 0.9.1 wants transformers < 5.11), e.g.:
#   python -m venv .venv-verl && .venv-verl/bin/pip install 'verl[vllm]==0.9.1' -e . --no-deps
#   (then install this package's runtime deps that verl does not: docker GitPython unidiff rich PyYAML)
# Cluster: `ray start --head` on the driver node; on every node that runs sandboxes
#   `ray start --address HEAD:6379 --resources '{"docker": 1}'` (each such node needs Docker, the sandbox images
#   from `gagar image build --all`, and the tasks dir at the same path).
# Then: bash recipes/verl/run.sh [extra hydra overrides]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv-verl/bin/python}"
MODEL="${MODEL:-Qwen/Qwen2.5-Coder-1.5B-Instruct}"
export GAGAR_TASKS_DIR="${GAGAR_TASKS_DIR:-$PWD/.gagar/tasks}"
export GAGAR_SANDBOX_EXECUTOR="${GAGAR_SANDBOX_EXECUTOR:-ray}"   # one sandbox actor per `docker` node (local: this node)
DATA="${DATA:-$PWD/.gagar/verl-data}"
"$PY" recipes/verl/prepare_data.py --tasks-dir "$GAGAR_TASKS_DIR" --out "$DATA"
"$PY" recipes/verl/main.py --config-path "$PWD/recipes/verl" --config-name gagar \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/val.parquet" \
  actor_rollout_ref.model.path="$MODEL" \
  reward.custom_reward_function.path="$PWD/recipes/verl/reward.py" \
  "$@"
