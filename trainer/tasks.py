"""Which tasks a step trains on: the instances file (filtered by the config) and a resumable epoch sampler."""

from __future__ import annotations

import json
import random
from typing import TypeVar

from sandbox.inputs import require_runnable
from sandbox.jsonl import iter_jsonl
from sandbox.records import Instance
from trainer.config import TasksConfig, TrainConfig

T = TypeVar("T")


def fixed_subset(items: list[T], k: int) -> list[T]:
    """`k` of `items`, drawn with seed 0 and kept in their order (all of them when `k` is 0 or at least their
    number): every run, seed and arm gets the same subset of the same list."""
    if k <= 0 or k >= len(items):
        return list(items)
    return [items[i] for i in sorted(random.Random(0).sample(range(len(items)), k))]


def split_ids(tasks: TasksConfig) -> set[str] | None:
    """The instance ids of `tasks.split` (from `splits.json` beside the instances file), or None for all."""
    if not tasks.split:
        return None
    path = tasks.instances_path().parent / "splits.json"
    try:
        splits = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"tasks.split={tasks.split} needs a readable {path} ({exc}); `gagar tasks synth` "
                         "writes one, or leave tasks.split empty") from exc
    ids = splits.get(tasks.split) if isinstance(splits, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        known = [k for k, v in splits.items() if isinstance(v, list)] if isinstance(splits, dict) else []
        raise ValueError(f"{path} has no split {tasks.split!r} (a list of instance ids); it has: "
                         f"{', '.join(known) or 'none'}")
    return set(ids)


def other_split_ids(tasks: TasksConfig) -> set[str]:
    """The instance ids of every split but `tasks.split` in the set's `splits.json` (none when no split is set):
    the tasks a run on `tasks` must never train or warm-start on."""
    if not tasks.split:
        return set()
    splits = json.loads((tasks.instances_path().parent / "splits.json").read_text())
    return {i for name, ids in splits.items() if name != tasks.split and isinstance(ids, list) for i in ids
            if isinstance(i, str)}


def check_heldout_split(tasks: TasksConfig, heldout: str) -> None:
    """Refuse a held-out split that is the training split, or that shares a task with it (a run that trains on
    every task has no held-out split): figures on it would be measured on tasks the policy trained on."""
    if not heldout:
        return
    if not tasks.split:
        raise ValueError(f"the held-out split {heldout!r} cannot be measured on a run that trains on every task "
                         "(tasks.split is empty); set tasks.split to the training split")
    if heldout == tasks.split:
        raise ValueError(f"the held-out split {heldout!r} is the training split (tasks.split); name another split")
    train, held = split_ids(tasks), split_ids(tasks.model_copy(update={"split": heldout}))
    if both := sorted((train or set()) & (held or set())):
        raise ValueError(f"splits {tasks.split!r} and {heldout!r} share {len(both)} task(s), e.g. {both[0]}: a "
                         "held-out task must never be trained on")


def load_instances(cfg: TrainConfig | TasksConfig) -> dict[str, Instance]:
    tasks = cfg.tasks if isinstance(cfg, TrainConfig) else cfg
    path = tasks.instances_path()
    if not path.is_file():
        raise FileNotFoundError(f"no instances file at {path}; build the bundled tasks with `make tasks` "
                                f"(or set tasks.dir / tasks.instances)")
    wanted = split_ids(tasks)
    out = {}
    for n, row in iter_jsonl(path):
        try:
            inst = Instance.from_dict(row)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: {exc}") from exc
        if tasks.languages and (inst.language or "") not in tasks.languages:
            continue
        if tasks.instance_ids and inst.instance_id not in tasks.instance_ids:
            continue
        if wanted is not None and inst.instance_id not in wanted:
            continue
        out[inst.instance_id] = inst
    if not out:
        raise ValueError(f"{path}: no instances left after the tasks.languages / tasks.instance_ids / tasks.split "
                         "filters")
    require_runnable(out, path)  # an instance without FAIL_TO_PASS would reward any patch: refuse, train nothing
    return out


class TaskSampler:
    """Epochs over the tasks, reshuffled each epoch; its position is checkpointed."""

    def __init__(self, ids: list[str], seed: int, shuffle: bool) -> None:
        self.ids, self.seed, self.shuffle = sorted(ids), seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._perm()

    def _perm(self) -> list[str]:
        order = list(self.ids)
        if self.shuffle:
            random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[str]:
        out = []
        while len(out) < k:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._perm()
