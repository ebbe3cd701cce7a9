"""The second source of `gagar sft data` (`--from-results`): the passing rollouts of a `gagar eval` run, grouped by
instance and ranked by a labeller — the heuristic, or a teacher model on an OpenAI-compatible server."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from grader.records import Group, InputError
from sandbox.records import EvalResult


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
    from grader.records import read_jsonl
    from sandbox.inputs import load_predictions

    notes: list[str] = []
    patches = {
        (p.instance_id, p.rollout_id): p.model_patch for p in load_predictions(predictions_path, notes)
    }
    by_inst: dict[str, list[EvalResult]] = defaultdict(list)
    for i, r in enumerate(read_jsonl(results_path), 1):
        if not r.get("instance_id") or r.get("rollout_id") is None:
            raise InputError(
                f"{results_path}: line {i} lacks instance_id or rollout_id (is it a results.jsonl?)"
            )
        try:
            res = EvalResult.from_dict({"model_name_or_path": "unknown", **r})
        except (TypeError, ValueError) as exc:
            raise InputError(f"{results_path}: line {i} is not a result record ({exc})") from exc
        by_inst[res.instance_id].append(res)
    backend = None
    if labeller == "teacher":
        from inference.openai import OpenAIBackend

        if not base_url or not model:
            raise InputError("--labeller teacher needs --base-url URL and --model NAME")
        backend = OpenAIBackend(base_url, model)
    specs = []
    for iid, results in sorted(by_inst.items()):
        inst = instances.get(iid)
        if inst is None:
            notes.append(f"{iid}: not in the instances file; skipped")
            continue
        # The one sandbox -> grader conversion (passing = EvalResult.passed: no tampering, no forged report).
        group = Group.from_results(inst, results, {r: p for (i, r), p in patches.items() if i == iid})
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
