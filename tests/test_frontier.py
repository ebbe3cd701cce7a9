"""Frontier tasks (`tasks.frontier_k`, trainer.frontier): the DAPO-style pre-filter keeps the training tasks the
starting policy solves sometimes (0 < p < 1), caches the estimate by what it depends on, and records it in the
run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gagar.schema import ConfigError
from trainer import frontier
from trainer.config import load_config
from trainer.tasks import load_instances

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "configs" / "loop_real.yaml"


def test_frontier_keeps_tasks_with_some_but_not_all_passes() -> None:
    rates = {"never": {"n": 8, "passed": 0}, "some": {"n": 8, "passed": 3}, "always": {"n": 8, "passed": 8},
             "unjudged": {"n": 0, "passed": 0}, "one": {"n": 7, "passed": 6}}
    assert frontier.frontier_ids(rates) == ["one", "some"]
    s = frontier.summary(rates)
    assert (s["tasks"], s["frontier"], s["always"], s["never"]) == (5, 2, 1, 2)
    assert s["frontier_share"] == pytest.approx(0.4)


def test_frontier_is_estimated_once_and_recorded_in_each_run(tmp_path: Path, monkeypatch) -> None:
    cfg = load_config(REAL, [f"model.cache_dir={tmp_path / 'models'}"])
    every = load_instances(cfg)
    instances = {i: every[i] for i in sorted(every)[:4]}
    ids = sorted(instances)
    calls = []

    def fake_estimate(c, backend, tok, inst, pool, judge, run_dir, log, **kw):
        calls.append(sorted(inst))
        return {ids[0]: {"n": 8, "passed": 0}, ids[1]: {"n": 8, "passed": 2}, ids[2]: {"n": 8, "passed": 8},
                ids[3]: {"n": 8, "passed": 5}}

    monkeypatch.setattr(frontier, "estimate", fake_estimate)
    kept = frontier.ensure_frontier(cfg, "some-base", None, None, instances, None, None, tmp_path / "run0",
                                    log=lambda m: None)
    assert kept == [ids[1], ids[3]] and calls == [ids]
    record = json.loads((tmp_path / "run0" / "frontier.json").read_text())
    assert record["kept"] == kept and record["frontier"] == 2 and record["k"] == 8
    # another run (another seed, another arm) from the same starting weights reuses the estimate
    assert frontier.ensure_frontier(cfg, "some-base", None, None, instances, None, None, tmp_path / "run1",
                                    log=lambda m: None) == kept
    assert len(calls) == 1 and (tmp_path / "run1" / "frontier.json").is_file()
    # other starting weights, or another k, are another estimate
    frontier.ensure_frontier(cfg, "other-base", None, None, instances, None, None, tmp_path / "run2",
                             log=lambda m: None)
    assert len(calls) == 2


def test_no_frontier_task_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    cfg = load_config(REAL, [f"model.cache_dir={tmp_path}"])
    every = load_instances(cfg)
    instances = {i: every[i] for i in sorted(every)[:2]}
    monkeypatch.setattr(frontier, "estimate", lambda *a, **k: {i: {"n": 8, "passed": 0} for i in instances})
    with pytest.raises(ValueError, match="no training task has 0 < p < 1.*2 never"):
        frontier.ensure_frontier(cfg, "b", None, None, instances, None, None, tmp_path / "run", log=lambda m: None)


def test_frontier_k_of_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="frontier_k=1"):
        load_config(REAL, ["tasks.frontier_k=1"])


def test_a_cut_estimate_goes_on_from_its_saved_chunks(tmp_path: Path, monkeypatch) -> None:
    """Chunks already estimated (saved in the partial file) are not sampled again."""
    import trainer.generation
    from sandbox.records import EvalResult
    from trainer.agent import Trajectory

    cfg = load_config(REAL, ["tasks.frontier_k=2"])
    every = load_instances(cfg)
    ids = sorted(every)[:40]
    instances = {i: every[i] for i in ids}
    asked: list[str] = []

    def fake_generate(r, backend, tok, inst, task_ids, tag, **kw):
        asked.extend(task_ids)
        return [[Trajectory(i, f"{tag}-{i}-{k}", [1, 2], [0, 1], 1, "p") for k in range(r.n)] for i in task_ids]

    class Pool:
        def config(self):
            return None

        def evaluate_masked(self, inst, preds, run_dir, log):
            return [EvalResult(p.instance_id, "m", p.rollout_id, "resolved" if p.rollout_id.endswith("-0") else
                               "unresolved", resolved=p.rollout_id.endswith("-0")) for p in preds]

    class Judge:
        def check_hacks(self, groups):
            return 0

    monkeypatch.setattr(trainer.generation, "generate", fake_generate)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({i: {"n": 2, "passed": 0} for i in ids[:32]}))  # the first chunk is done
    rates = frontier.estimate(cfg, None, None, instances, Pool(), Judge(), tmp_path / "run", lambda m: None,
                              partial=partial)
    assert asked == ids[32:] and len(rates) == 40
    assert all(rates[i] == {"n": 2, "passed": 1} for i in ids[32:])
    assert json.loads(partial.read_text()) == rates
