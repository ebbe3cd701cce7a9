"""Which tasks a step trains on: the instances file (filtered by the config) and a resumable epoch sampler."""

from __future__ import annotations

import random

from sandbox.inputs import require_runnable
from sandbox.jsonl import iter_jsonl
from sandbox.records import Instance
from trainer.config import TrainConfig


def load_instances(cfg: TrainConfig) -> dict[str, Instance]:
    path = cfg.tasks.instances_path()
    if not path.is_file():
        raise FileNotFoundError(f"no instances file at {path}; build the bundled tasks with `make tasks` "
                                f"(or set tasks.dir / tasks.instances)")
    out = {}
    for n, row in iter_jsonl(path):
        try:
            inst = Instance.from_dict(row)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: {exc}") from exc
        if cfg.tasks.languages and (inst.language or "") not in cfg.tasks.languages:
            continue
        if cfg.tasks.instance_ids and inst.instance_id not in cfg.tasks.instance_ids:
            continue
        out[inst.instance_id] = inst
    if not out:
        raise ValueError(f"{path}: no instances left after the tasks.languages / tasks.instance_ids filters")
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
