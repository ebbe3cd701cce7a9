#!/usr/bin/env bash
# `make demo`'s main job: RL post-training of a code agent on the bundled tasks, end to end on CPU — warm start,
# then steps of: rollouts → Docker sandbox → dynamic sampling → grader → GRPO+GAGAR advantages → clipped
# policy-gradient update. Prints the per-step view, the run summary and the wall time; plots go to the run dir.
#   bash scripts/demo.sh WORKDIR [CONFIG]   (make demo passes .gagar smol; CONFIG: smol | tiny, a name in configs/)
#   smol: the pretrained SmolLM2-135M-Instruct (pulled once: `gagar model pull smollm2-135m-instruct`), vLLM rollouts
#   tiny: a random 2-layer model that only proves the plumbing (`make demo-tiny`)
set -euo pipefail
WORK="${1:-.gagar}"
CONFIG="${2:-smol}"
VENV="${VENV:-.venv}"
TASKS="$WORK/tasks"
RUN="$WORK/runs/$CONFIG"
# torch's OpenMP threads spin while they wait; on a shared machine (more runnable jobs than cores) that spinning
# takes the cores from the threads doing the work: small matmuls ran 20x slower, sampling 9x (docs/trainer.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
start=$(date +%s.%N)
if [ ! -f "$TASKS/instances.jsonl" ]; then
  "$VENV/bin/python" examples/build_tasks.py --out "$TASKS"
fi
if [ "$CONFIG" = smol ]; then
  echo "== gagar model pull smollm2-135m-instruct (once per user; then read from the models cache, gagar model ls)"
  "$VENV/bin/gagar" model pull smollm2-135m-instruct
fi
echo "== gagar train --config configs/$CONFIG.yaml (run dir: $RUN)"
train_start=$(date +%s.%N)
"$VENV/bin/gagar" train --config "configs/$CONFIG.yaml" --out "$RUN" --set "tasks.dir=$TASKS"
echo "== metrics: $RUN/metrics.jsonl   plots: $RUN/plots/curves.png   checkpoints: $RUN/checkpoints/"
echo "== where the time went (also $RUN/demo_time.json):"
"$VENV/bin/python" scripts/demo_split.py "$RUN" "$start" "$train_start"
