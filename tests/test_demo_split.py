"""`make demo`'s time split (scripts/demo_split.py): the figures the README quotes come from it, so its sums and
its reading of the warm start (built in this run, or reused from the cache) must be right."""

from __future__ import annotations

import json
import os
import runpy
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, marker_age_s: float) -> dict:
    ws = tmp_path / "models" / "warmstart-abc"
    ws.mkdir(parents=True)
    (ws / "gagar_warmstart.json").write_text(json.dumps({"examples": 6, "final_loss": 0.2, "seconds": 120.5}))
    now = time.time()
    os.utime(ws / "gagar_warmstart.json", (now - marker_age_s, now - marker_age_s))
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "state.json").write_text(json.dumps({"step": 2, "base_model": str(ws)}))
    rows = [{"step": k, "rollouts": 4, "pass_rate": 0.5, "groups_kept": 1, "gagar_groups": 1, "gagar_moved": k - 1,
             "sampler_logprob_diff": 1e-6, "sampler_ratio_outside_clip": 0.0, "gen_s": 10.0, "score_s": 5.0,
             "eval_s": 3.0, "update_s": 20.0, "step_s": 40.0} for k in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main = runpy.run_path(str(ROOT / "scripts" / "demo_split.py"))["main"]
    out = main(run, now - 300.0, now - 290.0)
    assert json.loads((run / "demo_time.json").read_text()) == out
    return out


def test_the_split_adds_up_and_names_a_warm_start_built_in_this_run(tmp_path: Path) -> None:
    out = _run(tmp_path, marker_age_s=100.0)  # written after `gagar train` started: built now
    assert out["steps_s"] == 80.0 and out["before_train_s"] == 10.0
    assert 209.0 <= out["train_before_first_step_s"] <= 212.0  # 300 s wall − 10 − 80, plus the test's own time
    assert out["stages_s"]["gen_s"] == 20.0 and out["stages_s"]["update_s"] == 40.0
    assert out["warm_start"] == {"used": True, "built_this_run": True, "seconds": 120.5, "examples": 6,
                                 "final_loss": 0.2}
    assert [s["gagar_moved"] for s in out["steps"]] == [0, 1]


def test_a_cached_warm_start_is_reported_as_reused(tmp_path: Path) -> None:
    assert _run(tmp_path, marker_age_s=3600.0)["warm_start"]["built_this_run"] is False
