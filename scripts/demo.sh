#!/usr/bin/env bash
# `make demo`'s main job: RL post-training of a tiny code agent on the bundled tasks, end to end on CPU —
# warm start, then steps of: rollouts → Docker sandbox → dynamic sampling → grader → GRPO+GAGAR advantages →
# clipped policy-gradient update. Prints the per-step view and the run summary; plots go to the run dir.
#   bash scripts/demo.sh WORKDIR        (make demo passes .gagar; tasks are built by `make tasks`)
set -euo pipefail
WORK="${1:-.gagar}"
VENV="${VENV:-.venv}"
TASKS="$WORK/tasks"
RUN="$WORK/runs/tiny"
if [ ! -f "$TASKS/instances.jsonl" ]; then
  "$VENV/bin/python" examples/build_tasks.py --out "$TASKS"
fi
echo "== gagar train --config configs/tiny.yaml (run dir: $RUN)"
"$VENV/bin/gagar" train --config configs/tiny.yaml --out "$RUN" \
  --set "tasks.dir=$TASKS" --set "model.cache_dir=$WORK/models"
echo "== metrics: $RUN/metrics.jsonl   plots: $RUN/plots/curves.png   checkpoints: $RUN/checkpoints/"
