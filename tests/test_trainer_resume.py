"""`--resume` continues the task stream exactly: no task of a finished step is drawn again, none is skipped —
also with `rollout.overlap`, where the next step's tasks are drawn before the checkpoint is written. The loop
runs for real (sampler, step bookkeeping, metrics, checkpoints); only rollouts and the sandbox are stubbed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_fixtures import CONFIG

from trainer.checkpoint import latest_checkpoint, load_state
from trainer.config import load_config
from trainer.loop import Batch, Trainer
from trainer.metrics import MetricsWriter
from trainer.tasks import TaskSampler

TASKS = [f"task-{i}" for i in range(7)]


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)


def _trainer(out: Path, overlap: bool, drawn: dict[int, list[str]], state: dict | None = None) -> Trainer:
    cfg = load_config(CONFIG, [f"out={out}", "steps=4", "tensorboard=false", "rollout.tasks_per_step=2",
                               f"rollout.overlap={str(overlap).lower()}", "rollout.max_refill=1"])
    t = object.__new__(Trainer)
    t.cfg, t.out, t.log = cfg, out, print
    t.sampler = TaskSampler(TASKS, cfg.seed, shuffle=True)
    model = _Model()
    t.policy = type("P", (), {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                              "base_path": "base"})()
    t.restore(state or {})
    t.metrics = MetricsWriter(out, start_step=t.start_step, tensorboard=False)
    t.sample = lambda ids, tag: [[] for _ in ids]
    t._summary = lambda row: {}
    t.close = lambda: None  # no rollout engine or judge was started: nothing to hand back

    def collect(ids, tag, run_dir, trajs=None):
        drawn.setdefault(int(tag[1:].split("r")[0]), []).extend(ids)  # tag: s<step>r<batch>
        return Batch(ids, [], [])  # nothing kept: the step refills once, as a step with all-uniform groups does

    t.collect = collect
    return t


def _crash_at_step(n: int):
    def on_step(row: dict) -> None:
        if row["step"] == n:
            raise KeyboardInterrupt  # after step n's metrics, before its checkpoint: as a crash would
    return on_step


@pytest.mark.parametrize("overlap", [False, True])
def test_resume_neither_repeats_nor_skips_tasks(tmp_path, overlap):
    straight: dict[int, list[str]] = {}
    _trainer(tmp_path / "a", overlap, straight).run()
    crashed: dict[int, list[str]] = {}
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path / "b", overlap, crashed).run(on_step=_crash_at_step(2))
    state = load_state(latest_checkpoint(tmp_path / "b"))
    assert state["step"] == 1
    resumed: dict[int, list[str]] = {}
    t = _trainer(tmp_path / "b", overlap, resumed, state)
    assert t.start_step == 1
    t.run()
    # Every step trains on the tasks the uninterrupted run trained on: step 1 from before the crash, steps 2-4
    # after it (with overlap, step 2's first tasks were drawn before the crash and come back from the checkpoint).
    assert {1: crashed[1], **resumed} == straight
    everything = [i for s in sorted(straight) for i in straight[s]]
    assert len(everything) == 16 and all(everything.count(i) <= 3 for i in TASKS)  # 7 tasks: epochs of 7
