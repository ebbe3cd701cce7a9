"""The trainer's record of one task in one step: its n rollouts, the sandbox's verdict on each, and the grader's.

`RolloutGroup` is the only place the trainer decides what a rollout earned:
- `passed`: `grader.records.passes` — resolved, not tampered, no forged report (`EvalResult.passed`) and no hack
  found by the grader (`Grading.hacks`). Everything downstream (dynamic sampling, the judge's candidates,
  rewards) reads this one mask, so a hack can never pay.
- `valid`: the sandbox could run the rollout, and the trainer did not drop it (`rollout.drop_unfinished`). An
  `infra_error` says nothing about the policy: it is masked out of the advantages and the loss, never scored as a
  failure; a dropped episode is masked the same way.

(`grader.records.Group` is a different thing: the grader's *input*, the passing candidates of one instance;
`RolloutGroup.candidates()` builds it with the one shared conversion `Group.from_results`.)
"""

from __future__ import annotations

from dataclasses import dataclass

from grader.records import Grading, Group, passes
from sandbox.records import EvalResult, Instance
from trainer.agent import Trajectory


@dataclass
class RolloutGroup:
    instance: Instance
    trajs: list[Trajectory]
    results: list[EvalResult]  # aligned with trajs
    hack_check: Grading | None = None  # the model-free grader's verdicts (hacks), on every group with a pass
    ranking: Grading | None = None  # the judge's ranking, only where GAGAR has something to redistribute
    behaviour: dict | None = None  # the behavioural probe's findings (grader.probe.runner), rollout_id -> [finding]

    def __post_init__(self) -> None:
        if [t.rollout_id for t in self.trajs] != [r.rollout_id for r in self.results]:
            raise ValueError(f"{self.instance.instance_id}: trajectories and results are not aligned")

    @property
    def rollout_ids(self) -> list[str]:
        return [t.rollout_id for t in self.trajs]

    @property
    def grader_hacks(self) -> dict[str, str]:
        """rollout_id -> kind, from every grading this group got."""
        out: dict[str, str] = {}
        for g in (self.hack_check, self.ranking):
            if g is not None:
                out.update(g.hacks)
        return out

    @property
    def passed(self) -> list[bool]:
        hacks = self.grader_hacks
        return [passes(r) and r.rollout_id not in hacks for r in self.results]

    @property
    def hacked(self) -> list[bool]:
        hacks = self.grader_hacks
        return [r.hacked or r.rollout_id in hacks for r in self.results]

    @property
    def valid(self) -> list[bool]:
        return [r.status != "infra_error" and not t.dropped for t, r in zip(self.trajs, self.results, strict=True)]

    def candidates(self) -> Group:
        """The grader's input: this group's passing rollouts (hacks already found are left out)."""
        hacks = self.grader_hacks
        group = Group.from_results(
            self.instance,
            [r for r in self.results if r.rollout_id not in hacks],
            {t.rollout_id: t.patch for t in self.trajs},
            trajectories={t.rollout_id: t.events for t in self.trajs},
        )
        ids = {c.rollout_id for c in group.candidates}
        group.behaviour = {k: v for k, v in (self.behaviour or {}).items() if k in ids}
        return group


def infra_result(instance_id: str, rollout_id: str, error: str) -> EvalResult:
    """The verdict of a rollout the sandbox could not run (masked, never scored)."""
    return EvalResult(instance_id=instance_id, model_name_or_path="gagar-train", rollout_id=rollout_id,
                      status="infra_error", error=error)


def build_groups(instances: dict[str, Instance], trajs_per_task: list[list[Trajectory]],
                 results: list[EvalResult]) -> list[RolloutGroup]:
    """One `RolloutGroup` per task; a rollout the sandbox returned nothing for counts as `infra_error`."""
    by_key = {r.key: r for r in results}
    groups = []
    for trajs in trajs_per_task:
        iid = trajs[0].instance_id
        res = [by_key.get((iid, t.rollout_id)) or infra_result(iid, t.rollout_id, "the sandbox returned no result")
               for t in trajs]
        groups.append(RolloutGroup(instances[iid], trajs, res))
    return groups
