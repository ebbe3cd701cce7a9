"""The second source of `gagar sft data` (`--from-results`): the passing rollouts of a `gagar eval` run, grouped by
instance and ranked by a labeller — the heuristic, or a teacher model on an OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grader.records import InputError


def rollout_groups(
    instances: dict[str, Any],
    results_path: Path,
    predictions_path: Path,
    repos_dir: Path,
    *,
    labeller: str,
    base_url: str | None,
    model: str | None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Group specs from a `gagar eval` run: the resolved rollouts of each instance, ranked by the labeller."""
    from grader.grade import grade_group
    from grader.records import groups_from_run, load_results
    from sandbox.inputs import load_predictions

    notes: list[str] = []
    patches = {
        (p.instance_id, p.rollout_id): p.model_patch for p in load_predictions(predictions_path, notes)
    }
    # The one sandbox -> grader conversion (passing = EvalResult.passed: no tampering, no forged report).
    groups, more = groups_from_run(instances, load_results(results_path), patches, source=str(results_path))
    notes += more
    backend = None
    if labeller == "teacher":
        from inference.openai import OpenAIBackend

        if not base_url or not model:
            raise InputError("--labeller teacher needs --base-url URL and --model NAME")
        backend = OpenAIBackend(base_url, model)
    specs = []
    for group in sorted(groups, key=lambda g: g.instance_id):
        iid = group.instance_id
        cands = group.candidates
        if len(cands) < 2:
            notes.append(f"{iid}: fewer than two passing rollouts with a patch; skipped")
            continue
        g = grade_group(
            group, repos_dir, judge="heuristic" if labeller == "heuristic" else "llm", backend=backend
        )
        if g.fallback:
            notes.append(f"{iid}: the teacher's answer was unusable; skipped")
            continue
        order = [r for r in g.ranking if r in {c.rollout_id for c in cands}]
        evidence = {r: g.evidence.get(r) or [] for r in order}
        for r in order:  # the judge's answer format needs evidence for every candidate below tier 1
            if g.tiers.get(r, 1) > 1 and not evidence[r]:
                evidence[r] = [f"ranked below the best by the {labeller}"]
        specs.append(
            {
                "group": group,
                "source": iid,
                "order": order,
                "tiers": {r: int(g.tiers.get(r, 1)) for r in order},
                "evidence": evidence,
                "kinds": {},
            }
        )
    return specs, notes
