"""The grader in the loop: hack verdicts on every group that has a passing rollout, rankings where they matter.

Two calls, in this order within a step, on the grader's input (`grader.records.Group`: a task's passing
candidates) — so the native loop (`RolloutGroup`s) and verl (`trainer.integrations.verl_trainer`, rows of a
`DataProto`) run the same code and reach the same verdicts:
1. `check`: the model-free grader (`judge="heuristic"`) on every group with at least one passing rollout — hack
   detection needs no comparison, so a lone passing rollout is checked too. Its `Grading.hacks` reset those
   rollouts to failure *before* dynamic sampling and advantages. It is not gated by `needs_grading`: a hack in an
   all-passing group is exactly what must turn that group into a mixed one.
2. `rank`: the configured judge on the groups the caller says need a ranking (`needs_grading`: two or more passing
   rollouts with a positive base advantage). With the heuristic judge, the hack check's grading already is that
   ranking; the LLM judge gets the candidates without the hacks the check found.
With `grader.probe` (native loop), the behavioural probe (`grader.probe.runner`) runs before the check and its
findings (`Group.behaviour`) join the static ones in `Grading.hacks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grader.records import Grading, Group
from trainer.config import GraderSection
from trainer.groups import RolloutGroup


def without(group: Group, hacks: dict[str, str]) -> Group:
    """The grader group minus the candidates already found to be hacks (a hacked patch never reaches a judge)."""
    if not hacks:
        return group
    return dataclasses.replace(group, candidates=[c for c in group.candidates if c.rollout_id not in hacks])


class Judge:
    def __init__(self, section: GraderSection, repos_dir: Path, sandbox: Callable[[], Any] | None = None,
                 work_dir: Path | None = None, *, models_root: str | None = None) -> None:
        self.section = section
        self.repos_dir = Path(repos_dir)
        self.sandbox = sandbox  # the sandbox's config, for the behavioural probe
        self.work_dir = work_dir  # the run's dir: a `vllm serve` judge logs there
        self.models_root = models_root  # where a registry model name is pulled (the trainer's model.cache_dir)
        self._backend: Any = None

    def backend(self) -> Any:
        """The LLM judge's chat backend, built once on first use."""
        if self._backend is None:
            from inference.backends import make_backend

            s = self.section
            self._backend = make_backend(s.backend, s.model, adapter=s.adapter or None, base_url=s.base_url or None,
                                         work_dir=str(self.work_dir) if self.work_dir else None,
                                         models_root=self.models_root)
        return self._backend

    def close(self) -> None:
        """Hand back the judge's engine or server, if it was ever built."""
        from inference.backends import close_backend

        backend, self._backend = self._backend, None
        close_backend(backend)

    # ── on the grader's groups (the native loop and verl share these) ──────────────────────────────────────
    def check(self, groups: list[Group]) -> list[Grading]:
        """The model-free hack check of each group's passing candidates (groups without any are not asked)."""
        from grader.grade import grade_groups

        return grade_groups(groups, self.repos_dir, judge="heuristic") if groups else []

    def rank(self, groups: list[Group], checks: list[Grading]) -> list[Grading]:
        """Rankings of `groups` (each with its `check` grading): the check itself for the heuristic judge, else
        the configured judge on the candidates the check did not find to be hacks."""
        if not groups:
            return []
        if self.section.judge == "heuristic":
            return list(checks)
        from grader.grade import grade_groups

        s = self.section
        todo = [without(g, c.hacks) for g, c in zip(groups, checks, strict=True)]
        return grade_groups(todo, self.repos_dir, judge=s.judge, backend=self.backend(), permutations=s.permutations)

    # ── on the loop's RolloutGroups ────────────────────────────────────────────────────────────────────────
    def check_hacks(self, groups: list[RolloutGroup]) -> int:
        """Run the hack check on every group with a passing rollout; returns how many were checked."""
        todo = [g for g in groups if any(g.passed)]
        if self.section.probe and self.sandbox is not None:
            from grader.probe.runner import probe_group

            for g in todo:
                cands = g.candidates().candidates
                run = probe_group(g.instance, {c.rollout_id: c.patch for c in cands}, self.sandbox(),
                                  budget_s=self.section.probe_budget_s)
                g.behaviour = run.behaviour()
        for g, grading in zip(todo, self.check([g.candidates() for g in todo]), strict=True):
            g.hack_check = grading
        return len(todo)

    def rank_groups(self, groups: list[RolloutGroup]) -> None:
        """Rank the passing candidates of `groups` with the configured judge (their hacks count too)."""
        if any(g.hack_check is None for g in groups):
            raise ValueError("rank_groups needs the hack check first (check_hacks): every ranked group has a pass")
        checks = [g.hack_check for g in groups]
        for g, grading in zip(groups, self.rank([g.candidates() for g in groups], checks), strict=True):
            g.ranking = grading
