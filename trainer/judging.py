"""The grader in the loop: hack verdicts on every group that has a passing rollout, rankings where they matter.

Two calls, in this order within a step:
1. `check_hacks`: the model-free grader (`judge="heuristic"`) on every group with at least one passing rollout —
   hack detection needs no comparison, so a lone passing rollout is checked too. Its `Grading.hacks` reset those
   rollouts to failure (`RolloutGroup.passed`) *before* dynamic sampling and advantages. With `grader.probe`,
   the behavioural probe (`grader.probes`) runs first and its findings join the static ones.
2. `rank`: the configured judge on the groups the caller says need a ranking (two or more passing rollouts with
   a positive base advantage). With the heuristic judge, the hack check's grading already is that ranking.
Candidates are always `RolloutGroup.candidates()`: hacked rollouts never reach the judge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.config import GraderSection
from trainer.groups import RolloutGroup


class Judge:
    def __init__(self, section: GraderSection, repos_dir: Path, sandbox: Callable[[], Any] | None = None) -> None:
        self.section = section
        self.repos_dir = Path(repos_dir)
        self.sandbox = sandbox  # the sandbox's config, for the behavioural probe
        self._backend: Any = None

    def backend(self) -> Any:
        """The LLM judge's chat backend, built once on first use."""
        if self._backend is None:
            from grader.backends import make_backend

            s = self.section
            self._backend = make_backend(s.backend, s.model, adapter=s.adapter or None, base_url=s.base_url or None)
        return self._backend

    def check_hacks(self, groups: list[RolloutGroup]) -> int:
        """Run the hack check on every group with a passing rollout; returns how many were checked."""
        from grader.grade import grade_groups

        todo = [g for g in groups if any(g.passed)]
        if self.section.probe and self.sandbox is not None:
            from dataclasses import asdict

            from grader.probes import probe_group

            for g in todo:
                cands = g.candidates().candidates
                run = probe_group(g.instance, {c.rollout_id: c.patch for c in cands}, self.sandbox(),
                                  budget_s=self.section.probe_budget_s)
                g.behaviour = {rid: [asdict(f) for f in found] for rid, found in run.findings.items()}
        if todo:
            gradings = grade_groups([g.candidates() for g in todo], self.repos_dir, judge="heuristic")
            for g, grading in zip(todo, gradings, strict=True):
                g.hack_check = grading
        return len(todo)

    def rank(self, groups: list[RolloutGroup]) -> None:
        """Rank the passing candidates of `groups` with the configured judge (their hacks count too)."""
        if not groups:
            return
        if self.section.judge == "heuristic":
            for g in groups:
                g.ranking = g.hack_check
            return
        from grader.grade import grade_groups

        s = self.section
        gradings = grade_groups([g.candidates() for g in groups], self.repos_dir, judge=s.judge,
                                backend=self.backend(), permutations=s.permutations)
        for g, grading in zip(groups, gradings, strict=True):
            g.ranking = grading
