"""The model-free ranker: diff features → penalty score → ranking → tiers → weights, with evidence.

Score (lower is better), per candidate:

    0.05 × (lines added + removed)            minimality: every changed line costs a little
  + 1.0  × (files touched − 1)                scope: each extra file
  + 0.3  × (hunks − files touched)            scattered edits inside a file
  + PENALTY[kind] × (findings of that kind)   see PENALTY below

Ranking: ascending score, ties broken by lines changed, then rollout id (deterministic).
Tiers by the gap to the best score: ≤ TIER1_GAP → tier 1, ≤ TIER2_GAP → tier 2, else tier 3.
Weights: `grader.records.tier_weights` (T1 = 1.0, T2 = 0.6, T3 = 0.2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

from grader.features import CandidateFeatures, group_features
from grader.hacks.detect import HackFinding, apply_hacks, workspace_hacks
from grader.records import Grading, Group, tier_weights
from grader.workspace import SharedWorkspace

PENALTY = {
    "test_edit": 3.0,
    "out_of_scope": 2.0,
    "unique_file": 1.0,
    "whitespace_only": 1.0,
    "debug_output": 2.0,
    "commented_code": 1.0,
    "todo": 1.0,
    "unused_function": 2.0,
    "duplicate_line": 0.5,
}
LINE_COST = 0.05
FILE_COST = 1.0
HUNK_COST = 0.3
TIER1_GAP = 0.5
TIER2_GAP = 3.0
MAX_EVIDENCE = 8


def append_unapplied(ranking: list[str], tiers: dict[str, int], evidence: dict[str, list[str]],
                     failed: dict[str, str]) -> None:
    """Candidates whose patch was refused or did not apply go last, in tier 3, with the reason as evidence."""
    for rid in sorted(failed):
        ranking.append(rid)
        tiers[rid] = 3
        evidence[rid] = [f"patch: {failed[rid]}"]


def score(f: CandidateFeatures) -> float:
    n_files = len(f.files)
    s = LINE_COST * (f.added + f.removed) + FILE_COST * max(0, n_files - 1) + HUNK_COST * max(0, f.hunks - n_files)
    s += sum(PENALTY.get(x.kind, 0.0) for x in f.findings)
    return round(s, 4)


def _evidence(f: CandidateFeatures, gap: float) -> list[str]:
    ev = [x.cite() for x in sorted(f.findings, key=lambda x: (-PENALTY.get(x.kind, 0), x.file, x.line))]
    ev = ev[:MAX_EVIDENCE]
    if gap > 0:
        where = f"{f.files[0]}:{f.first_lines.get(f.files[0], 1)}" if f.files else "patch"
        ev.append(
            f"{where}: {len(f.files)} file(s), {f.hunks} hunk(s), +{f.added} -{f.removed} lines "
            f"(heuristic penalty +{gap:g} over the best candidate)"
        )
    return ev


def rank_features(
    instance_id: str,
    feats: dict[str, CandidateFeatures],
    failed: dict[str, str] | None = None,
    hacks: dict[str, list[HackFinding]] | None = None,
) -> Grading:
    """Turn per-candidate features into a Grading; unstageable or unparsable candidates go last, tier 3.

    Candidates with hack findings are scored apart: the others are ranked and tiered among themselves (a hack's
    small diff must not set the bar that pushes a general fix down a tier), then `apply_hacks` puts the hacks
    last in tier 3 with their evidence.
    """
    failed = dict(failed or {})
    hacks = {r: f for r, f in (hacks or {}).items() if f and r not in failed}
    for rid, f in feats.items():
        if f.parse_error and rid not in failed:
            failed[rid] = f.parse_error
    ok = {rid: f for rid, f in feats.items() if rid not in failed and rid not in hacks}
    scores = {rid: score(f) for rid, f in ok.items()}
    ranking = sorted(ok, key=lambda r: (scores[r], ok[r].added + ok[r].removed, r))
    best = scores[ranking[0]] if ranking else 0.0
    tiers: dict[str, int] = {}
    evidence: dict[str, list[str]] = {}
    for rid in ranking:
        gap = round(scores[rid] - best, 4)
        tiers[rid] = 1 if gap <= TIER1_GAP else 2 if gap <= TIER2_GAP else 3
        evidence[rid] = _evidence(ok[rid], gap)
    for rid in sorted(hacks):
        ranking.append(rid)
        tiers[rid] = 3
        evidence[rid] = []
    append_unapplied(ranking, tiers, evidence, failed)
    grading = Grading(
        instance_id=instance_id,
        ranking=ranking,
        tiers=tiers,
        weights=tier_weights(tiers),
        evidence=evidence,
        judge="heuristic",
        fallback=False,
    )
    return apply_hacks(grading, hacks)


def workspace_features(ws: SharedWorkspace, exclude: Collection[str] = ()) -> dict[str, CandidateFeatures]:
    """Features of the staged candidates but `exclude` (references are searched in each patched tree)."""
    trees = {ws.rollout_of(lab): ws.worktree(lab) for lab in ws.labels}
    g = ws.group
    staged = dataclasses.replace(g, candidates=[c for c in g.candidates
                                                if c.rollout_id not in ws.failed and c.rollout_id not in exclude])
    return group_features(staged, trees)


def rank_workspace(ws: SharedWorkspace) -> Grading:
    """Rank inside an open workspace; candidates with hack findings (`grader.hacks.detect`) are ranked last."""
    hacks = workspace_hacks(ws)
    return rank_features(ws.group.instance_id, workspace_features(ws, exclude=hacks), ws.failed, hacks)


def rank_group(group: Group, repos_dir: str | Path) -> Grading:
    """Heuristic grading of one group (contract API): stages the shared workspace, then ranks."""
    with SharedWorkspace(group, repos_dir) as ws:
        return rank_workspace(ws)
