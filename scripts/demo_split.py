"""Where `make demo`'s wall time went: per step (pass rate, GAGAR groups moved, the sampling/scoring mismatch,
seconds per stage) and in all (before the first step: the warm start, model loads, the vLLM engine's start).
    python scripts/demo_split.py RUN_DIR STARTED_EPOCH_S TRAIN_STARTED_EPOCH_S
Prints a table and writes RUN_DIR/demo_time.json (the README's figures come from it)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sandbox.jsonl import atomic_write_text, read_jsonl
from trainer.checkpoint import latest_checkpoint, load_state

STAGES = ("gen_s", "score_s", "eval_s", "check_s", "rank_s", "update_s", "sync_s")


def warm_start(run: Path, train_started: float) -> dict:
    """The warm start the run trained on: built in this run (its seconds) or reused from the cache."""
    ckpt = latest_checkpoint(run)
    base = Path(load_state(ckpt).get("base_model", "")) if ckpt else None
    marker = base / "gagar_warmstart.json" if base else None
    if marker is None or not marker.is_file():
        return {"used": False}
    info = json.loads(marker.read_text())
    return {"used": True, "built_this_run": marker.stat().st_mtime >= train_started,
            "seconds": info.get("seconds"), "examples": info.get("examples"), "final_loss": info.get("final_loss")}


def main(run: Path, started: float, train_started: float) -> dict:
    wall = time.time() - started
    rows = read_jsonl(run / "metrics.jsonl")
    steps_s = sum(r.get("step_s", 0.0) for r in rows)
    ws = warm_start(run, train_started)
    out = {"wall_s": round(wall, 1), "before_train_s": round(train_started - started, 1),
           "train_before_first_step_s": round(wall - (train_started - started) - steps_s, 1),
           "steps_s": round(steps_s, 1), "warm_start": ws,
           "stages_s": {k: round(sum(r.get(k, 0.0) for r in rows), 1) for k in STAGES},
           "steps": [{k: r.get(k) for k in ("step", "rollouts", "pass_rate", "groups_kept", "gagar_groups",
                                             "gagar_moved", "sampler_logprob_diff", "sampler_ratio_outside_clip",
                                             "step_s", *STAGES)} for r in rows]}
    atomic_write_text(run / "demo_time.json", json.dumps(out, indent=2) + "\n")
    print("step  rollouts  pass  kept  gagar groups/moved  |Δlogp|   outside clip  step s")
    for s in out["steps"]:
        print(f"{s['step']:>4}  {s['rollouts']:>8}  {s['pass_rate']:.2f}  {s['groups_kept']:>4}  "
              f"{s.get('gagar_groups') or 0:>12}/{s.get('gagar_moved') or 0:<5}  "
              f"{s.get('sampler_logprob_diff') or 0:.1e}  {s.get('sampler_ratio_outside_clip') or 0:>12.3f}  "
              f"{s['step_s']:>6.0f}")
    built = ("built in this run, " if ws.get("built_this_run") else "reused from the cache, built in ") \
        if ws.get("used") else ""
    print(f"wall {wall:.0f} s = before `gagar train` {out['before_train_s']:.0f} s + before step 1 "
          f"{out['train_before_first_step_s']:.0f} s (warm start {built}{ws.get('seconds', 0)} s; model loads; "
          f"the vLLM engine's start) + {len(rows)} steps {steps_s:.0f} s ("
          + ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in out["stages_s"].items()) + ")")
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
